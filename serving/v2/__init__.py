"""The Open Inference Protocol v2 (KServe / Triton): REST routes and gRPC service over the same Predictor."""
