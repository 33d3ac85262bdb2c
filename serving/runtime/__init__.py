"""Running a loaded version: the backends (ONNX Runtime, TF SavedModel, FeatureSpec), batching, runners."""
