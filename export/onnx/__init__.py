"""export/onnx."""
