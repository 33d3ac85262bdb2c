"""TF Serving's protos, from the committed FileDescriptorSet, in a private descriptor pool.

The pool is private so that these classes never clash with TensorFlow's own generated ones when the
TF backend is loaded in the same process. Message classes are built with `GetMessageClass`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DESCRIPTOR_SET = Path(__file__).with_name("tf_serving.binpb")


def private_pool(descriptor_set: Path) -> descriptor_pool.DescriptorPool:
    """A new pool holding every file of a committed FileDescriptorSet (written in dependency order)."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes())
    private = descriptor_pool.DescriptorPool()
    for file_proto in fds.file:
        private.Add(file_proto)
    return private


@cache
def pool() -> descriptor_pool.DescriptorPool:
    """Return the private pool holding every file of `tf_serving.binpb`."""
    return private_pool(DESCRIPTOR_SET)


@cache
def message_class(full_name: str) -> Any:
    """Return the message class of `full_name`, e.g. `tensorflow.serving.PredictRequest`."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


def enum_value(enum_full_name: str, value_name: str) -> int:
    """Return the number of `value_name` in the enum `enum_full_name` (e.g. `tensorflow.error.Code`, `OK`)."""
    return int(pool().FindEnumTypeByName(enum_full_name).values_by_name[value_name].number)


# The messages the server uses, resolved once at import (cheap: the pool holds a few dozen small files).
PredictRequest = message_class("tensorflow.serving.PredictRequest")
PredictResponse = message_class("tensorflow.serving.PredictResponse")
GetModelMetadataRequest = message_class("tensorflow.serving.GetModelMetadataRequest")
GetModelMetadataResponse = message_class("tensorflow.serving.GetModelMetadataResponse")
GetModelStatusRequest = message_class("tensorflow.serving.GetModelStatusRequest")
GetModelStatusResponse = message_class("tensorflow.serving.GetModelStatusResponse")
ModelVersionStatus = message_class("tensorflow.serving.ModelVersionStatus")
SignatureDefMap = message_class("tensorflow.serving.SignatureDefMap")
PredictionLog = message_class("tensorflow.serving.PredictionLog")
