"""The Open Inference Protocol v2 gRPC protos (package `inference`), from the committed `inference_v2.binpb`.

A private pool, like TF Serving's (serving/protos/__init__.py): the server needs neither tritonclient nor
grpcio-tools at run time. `python -m serving.protos.refresh` rewrites the file from tritonclient's protos.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pool, message_factory

from serving.protos import private_pool

DESCRIPTOR_SET = Path(__file__).with_name("inference_v2.binpb")
SERVICE = "inference.GRPCInferenceService"


@cache
def pool() -> descriptor_pool.DescriptorPool:
    """The private pool holding every file of `inference_v2.binpb`."""
    return private_pool(DESCRIPTOR_SET)


def message_class(name: str) -> Any:
    """The message class `inference.<name>`, e.g. `ModelInferRequest`."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(f"inference.{name}"))


# Request -> response class of each RPC the server answers.
RPCS = {
    rpc: (message_class(f"{rpc}Request"), message_class(f"{rpc}Response"))
    for rpc in (
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    )
}
ModelInferResponse = RPCS["ModelInfer"][1]
ModelMetadataResponse = RPCS["ModelMetadata"][1]
