"""serving/dataplane."""
