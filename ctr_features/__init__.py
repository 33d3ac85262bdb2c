"""The features room: FeatureSpec (raw Criteo fields -> float32 vectors), its fit, vocabularies and rate tables."""
