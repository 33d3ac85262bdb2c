"""serving/repository."""
