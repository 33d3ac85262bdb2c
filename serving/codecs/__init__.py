"""Wire formats -> batches: REST JSON bodies, gRPC TensorProtos and raw Criteo rows, each to a DecodedRequest."""
