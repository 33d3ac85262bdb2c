"""training/runtime."""
