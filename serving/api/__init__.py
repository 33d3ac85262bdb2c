"""TF Serving's REST and gRPC APIs: routing, request decoding off the loop, validation and the predict path."""
