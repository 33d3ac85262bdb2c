"""serving/protocols."""
