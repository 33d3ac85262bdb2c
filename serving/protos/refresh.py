"""Dev tool: dump TF Serving's protos from `tensorflow-serving-api` into `tf_serving.binpb`.

Run `python -m serving.protos.refresh` after upgrading tensorflow-serving-api. The server itself never
imports TensorFlow: it loads the committed FileDescriptorSet into a private descriptor pool.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

# The tensorflow_serving.apis modules whose services and messages the server speaks.
API_MODULES = (
    "tensorflow_serving.apis.predict_pb2",
    "tensorflow_serving.apis.get_model_metadata_pb2",
    "tensorflow_serving.apis.get_model_status_pb2",
    "tensorflow_serving.apis.model_pb2",
    "tensorflow_serving.apis.prediction_log_pb2",
    "tensorflow_serving.apis.prediction_service_pb2",
    "tensorflow_serving.apis.model_service_pb2",
)
DEFAULT_OUT = Path(__file__).with_name("tf_serving.binpb")


def _collect(fd: FileDescriptor, seen: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    """Add `fd` after its dependencies (topological order, so a pool can Add() them in sequence)."""
    if fd.name in seen:
        return
    for dep in fd.dependencies:
        _collect(dep, seen)
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)
    seen[fd.name] = proto


def build_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """Return the FileDescriptorSet of TF Serving's API protos and all their transitive dependencies."""
    seen: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for name in API_MODULES:
        _collect(importlib.import_module(name).DESCRIPTOR, seen)
    return descriptor_pb2.FileDescriptorSet(file=list(seen.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the FileDescriptorSet")
    args = parser.parse_args()
    fds = build_descriptor_set()
    args.out.write_bytes(fds.SerializeToString(deterministic=True))
    print(f"wrote {len(fds.file)} files to {args.out}")


if __name__ == "__main__":
    main()
