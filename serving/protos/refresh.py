"""Dev tool: dump TF Serving's protos (`tensorflow-serving-api`) into `tf_serving.binpb` and the Open Inference
Protocol v2 protos (`tritonclient`'s grpc_service.proto, package `inference`) into `inference_v2.binpb`.

Run `python -m serving.protos.refresh` after upgrading tensorflow-serving-api or tritonclient. The server itself never
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
    "tensorflow_serving.config.model_server_config_pb2",  # --model_config_file (serving/repository/model_config.py)
)
DEFAULT_OUT = Path(__file__).with_name("tf_serving.binpb")
V2_MODULE = "tritonclient.grpc.service_pb2"  # KServe's grpc_predict_v2 RPCs, plus Triton's own
V2_OUT = Path(__file__).with_name("inference_v2.binpb")


def _collect(fd: FileDescriptor, seen: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    """Add `fd` after its dependencies (topological order, so a pool can Add() them in sequence)."""
    if fd.name in seen:
        return
    for dep in fd.dependencies:
        _collect(dep, seen)
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)
    seen[fd.name] = proto


def ssl_config_file() -> descriptor_pb2.FileDescriptorProto:
    """TF Serving's `tensorflow_serving/config/ssl_config.proto` (--ssl_config_file), which tensorflow-serving-api
    does not ship: its one message, field for field (server_key = 1, server_cert = 2, custom_ca = 3,
    client_verify = 4)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/config/ssl_config.proto", package="tensorflow.serving", syntax="proto3"
    )
    message = proto.message_type.add(name="SSLConfig")
    field = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate(
        (
            ("server_key", field.TYPE_STRING),
            ("server_cert", field.TYPE_STRING),
            ("custom_ca", field.TYPE_STRING),
            ("client_verify", field.TYPE_BOOL),
        ),
        start=1,
    ):
        message.field.add(
            name=name,
            number=number,
            type=kind,
            label=field.LABEL_OPTIONAL,
            json_name="".join(w.title() if i else w for i, w in enumerate(name.split("_"))),
        )
    return proto


def build_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """Return the FileDescriptorSet of TF Serving's API protos and all their transitive dependencies."""
    seen: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for name in API_MODULES:
        _collect(importlib.import_module(name).DESCRIPTOR, seen)
    ssl = ssl_config_file()
    seen[ssl.name] = ssl
    return descriptor_pb2.FileDescriptorSet(file=list(seen.values()))


def build_v2_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """Return the FileDescriptorSet of the v2 `inference` protos and their dependencies."""
    seen: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    _collect(importlib.import_module(V2_MODULE).DESCRIPTOR, seen)
    return descriptor_pb2.FileDescriptorSet(file=list(seen.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write TF Serving's set")
    parser.add_argument("--v2_out", type=Path, default=V2_OUT, help="where to write the v2 set")
    args = parser.parse_args()
    for fds, out in ((build_descriptor_set(), args.out), (build_v2_descriptor_set(), args.v2_out)):
        out.write_bytes(fds.SerializeToString(deterministic=True))
        print(f"wrote {len(fds.file)} files to {out}")


if __name__ == "__main__":
    main()
