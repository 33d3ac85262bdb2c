"""ctr_model."""
