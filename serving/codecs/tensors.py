"""TensorProto ⇄ numpy without TensorFlow: `tensor_content` bytes or the repeated `float_val` field."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctr_contract.signatures import DEFAULT_WIDTH
from serving import protos
from serving.errors import InvalidArgument

DT_FLOAT = protos.enum_value("tensorflow.DataType", "DT_FLOAT")
DTYPE_NAMES = {v.number: v.name for v in protos.pool().FindEnumTypeByName("tensorflow.DataType").values}


def to_ndarray(tensor: Any, name: str) -> np.ndarray:
    """Decode a float TensorProto into a float32 array of its declared shape.

    Args:
        tensor: a `tensorflow.TensorProto` (from any pool: only its fields are read).
        name: the input name, for error messages.
    Returns:
        float32 array with the tensor's shape, e.g. (N, 128).
    """
    if tensor.dtype != DT_FLOAT:
        got = DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype))
        raise InvalidArgument(f"input '{name}' expects dtype DT_FLOAT, got {got}")
    if tensor.tensor_shape.unknown_rank:
        raise InvalidArgument(f"input '{name}' has unknown rank; send a shape such as [N, {DEFAULT_WIDTH}]")
    shape = tuple(int(d.size) for d in tensor.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input '{name}' has a negative dimension in shape {list(shape)}")
    size = math.prod(shape)  # exact: np.prod would wrap around in int64 for dims such as [2**62, 4]
    if tensor.tensor_content:
        if len(tensor.tensor_content) != size * 4:
            raise InvalidArgument(
                f"input '{name}' tensor_content has {len(tensor.tensor_content)} bytes, "
                f"expected {size * 4} for float32 shape {list(shape)}"
            )
        return np.frombuffer(tensor.tensor_content, dtype="<f4").reshape(shape)
    values = np.asarray(tensor.float_val, dtype=np.float32)
    if values.size == size:
        return values.reshape(shape)
    # TF fills the whole tensor with a single float_val (tensor_util.make_tensor_proto of a scalar fill).
    # A read-only view, not np.full: a few bytes may declare [10**9, 128], and validation bounds the rows
    # before anything copies them.
    if values.size == 1:
        try:
            return np.broadcast_to(values[0], shape)
        except ValueError as exc:  # more elements than an array can index
            raise InvalidArgument(f"input '{name}' shape {list(shape)} is too large") from exc
    raise InvalidArgument(
        f"input '{name}' has {values.size} float_val values, expected {size} for shape {list(shape)}"
    )


def from_ndarray(array: np.ndarray, tensor: Any) -> None:
    """Fill the TensorProto `tensor` (in place, as protobuf map values require) from a float32 array."""
    array = np.ascontiguousarray(array, dtype="<f4")
    tensor.dtype = DT_FLOAT
    for d in array.shape:
        tensor.tensor_shape.dim.add().size = d
    tensor.tensor_content = array.tobytes()
