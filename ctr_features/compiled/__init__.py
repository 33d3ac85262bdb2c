"""ctr_features/compiled."""
