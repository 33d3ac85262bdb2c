"""serving/runtime."""
