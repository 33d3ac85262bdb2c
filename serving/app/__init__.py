"""serving/app."""
