"""ONNX op -> TensorFlow ops, one function per op. Standard TF ops only, so stock TF Serving loads the result.

Each function takes the node's inputs (None for an omitted optional input) and attributes and returns
one tensor per node output, following the ONNX operator spec for opsets 13-18.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import tensorflow as tf
from onnx import numpy_helper

from export.errors import UnsupportedOpError


@dataclass(frozen=True)
class OpCall:
    """One ONNX node ready to translate: its proto, resolved inputs and decoded attributes."""

    node: onnx.NodeProto
    inputs: list[Any]  # tf.Tensor / tf.Variable, or None for an omitted optional input
    attrs: dict[str, Any]

    def input(self, i: int) -> Any:
        return self.inputs[i] if i < len(self.inputs) else None

    def fail(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"ONNX node {self.node.name!r} ({self.node.op_type}): {why}")


OpFn = Callable[[OpCall], list[Any]]
TF_OPS: dict[str, OpFn] = {}


def register(op: str) -> Callable[[OpFn], OpFn]:
    """Add a translation for ONNX `op` to TF_OPS."""

    def add(fn: OpFn) -> OpFn:
        TF_OPS[op] = fn
        return fn

    return add


def _static_ints(t: Any) -> list[int] | None:
    """The value of a small integer tensor known at trace time (constants, initializers), else None."""
    v = tf.get_static_value(t)
    return None if v is None else [int(i) for i in np.ravel(v)]


@register("Gemm")
def gemm(c: OpCall) -> list[Any]:
    # Y = alpha * A' B' + beta * C; scaling skipped at 1.0 so the common case is one MatMul + Add.
    y = tf.linalg.matmul(
        c.inputs[0],
        c.inputs[1],
        transpose_a=bool(c.attrs.get("transA", 0)),
        transpose_b=bool(c.attrs.get("transB", 0)),
    )
    alpha, beta = float(c.attrs.get("alpha", 1.0)), float(c.attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    bias = c.input(2)
    if bias is not None:
        y = y + (bias if beta == 1.0 else bias * beta)
    return [y]


@register("MatMul")
def matmul(c: OpCall) -> list[Any]:
    # numpy.matmul semantics: a 1-D operand is promoted to a matrix and the added dim removed again.
    a, b = c.inputs[0], c.inputs[1]
    a_vec, b_vec = a.shape.rank == 1, b.shape.rank == 1
    y = tf.linalg.matmul(a[tf.newaxis, :] if a_vec else a, b[:, tf.newaxis] if b_vec else b)
    if b_vec:
        y = tf.squeeze(y, -1)
    if a_vec:
        y = tf.squeeze(y, -2)
    return [y]


@register("Add")
def add(c: OpCall) -> list[Any]:
    return [tf.math.add(c.inputs[0], c.inputs[1])]


@register("Sub")
def sub(c: OpCall) -> list[Any]:
    return [tf.math.subtract(c.inputs[0], c.inputs[1])]


@register("Mul")
def mul(c: OpCall) -> list[Any]:
    return [tf.math.multiply(c.inputs[0], c.inputs[1])]


@register("Div")
def div(c: OpCall) -> list[Any]:
    a, b = c.inputs
    # ONNX integer Div truncates toward zero; floats divide exactly like RealDiv.
    return [tf.math.truncatediv(a, b) if a.dtype.is_integer else tf.math.divide(a, b)]


@register("Relu")
def relu(c: OpCall) -> list[Any]:
    return [tf.nn.relu(c.inputs[0])]


@register("LeakyRelu")
def leaky_relu(c: OpCall) -> list[Any]:
    return [tf.nn.leaky_relu(c.inputs[0], alpha=float(c.attrs.get("alpha", 0.01)))]


@register("Clip")
def clip(c: OpCall) -> list[Any]:
    # opset >= 11: min/max are optional inputs; opset < 11: attributes. min > max yields max, as in ONNX.
    x = c.inputs[0]
    lo = c.input(1) if "min" not in c.attrs else tf.constant(c.attrs["min"], x.dtype)
    hi = c.input(2) if "max" not in c.attrs else tf.constant(c.attrs["max"], x.dtype)
    if lo is not None:
        x = tf.math.maximum(x, lo)
    if hi is not None:
        x = tf.math.minimum(x, hi)
    return [x]


@register("Sigmoid")
def sigmoid(c: OpCall) -> list[Any]:
    return [tf.math.sigmoid(c.inputs[0])]


@register("Tanh")
def tanh(c: OpCall) -> list[Any]:
    return [tf.math.tanh(c.inputs[0])]


@register("Identity")
def identity(c: OpCall) -> list[Any]:
    return [tf.identity(c.inputs[0])]


@register("Dropout")
def dropout(c: OpCall) -> list[Any]:
    # Inference only: output = input and mask = all true. A constant training_mode=True is refused.
    training = c.input(2)
    if training is not None and (
        tf.get_static_value(training) is None or bool(tf.get_static_value(training))
    ):
        raise c.fail("training_mode must be a constant False for inference export")
    x = c.inputs[0]
    outs = [tf.identity(x)]
    if len(c.node.output) > 1 and c.node.output[1]:
        outs.append(tf.ones_like(x, dtype=tf.bool))
    return outs


@register("Constant")
def constant(c: OpCall) -> list[Any]:
    a = c.attrs
    if "value" in a:
        return [tf.constant(numpy_helper.to_array(a["value"]))]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32)):
        if key in a:
            return [tf.constant(np.asarray(a[key], dtype=dtype))]
    for key in ("value_int", "value_ints"):
        if key in a:
            return [tf.constant(np.asarray(a[key], dtype=np.int64))]
    raise c.fail(f"only value/value_float(s)/value_int(s) are supported, got attributes {sorted(a)}")


@register("Flatten")
def flatten(c: OpCall) -> list[Any]:
    # (d0..dk-1, dk..dn) -> (d0*..*dk-1, dk*..*dn); static products where known keep shapes for TF Serving.
    x = c.inputs[0]
    rank = x.shape.rank
    axis = int(c.attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    dims = x.shape.as_list()
    left = None if None in dims[:axis] else int(np.prod(dims[:axis], dtype=np.int64))
    right = None if None in dims[axis:] else int(np.prod(dims[axis:], dtype=np.int64))
    if right is not None:
        return [tf.reshape(x, [-1 if left is None else left, right])]
    if left is not None:
        return [tf.reshape(x, [left, -1])]
    shape = tf.shape(x)
    return [tf.reshape(x, tf.stack([tf.reduce_prod(shape[:axis]), tf.reduce_prod(shape[axis:])]))]


@register("Reshape")
def reshape(c: OpCall) -> list[Any]:
    # A 0 in the target shape copies the input dim (unless allowzero=1); -1 is inferred.
    x, shape = c.inputs
    copy_zero = not c.attrs.get("allowzero", 0)
    target = _static_ints(shape)
    if target is not None:
        dyn = tf.shape(x)
        dims = [
            (x.shape[i] if x.shape[i] is not None else dyn[i]) if (s == 0 and copy_zero) else s
            for i, s in enumerate(target)
        ]
        return [tf.reshape(x, dims if all(isinstance(d, int) for d in dims) else tf.stack(dims))]
    shape = tf.cast(shape, tf.int64)
    if copy_zero:
        n = tf.size(shape)
        in_dims = tf.concat([tf.shape(x, out_type=tf.int64), tf.ones([n], tf.int64)], 0)[:n]
        shape = tf.where(tf.equal(shape, 0), in_dims, shape)
    return [tf.reshape(x, shape)]


@register("Concat")
def concat(c: OpCall) -> list[Any]:
    return [tf.concat([t for t in c.inputs if t is not None], axis=int(c.attrs["axis"]))]


@register("BatchNormalization")
def batch_norm(c: OpCall) -> list[Any]:
    # Inference form over channel axis 1: (x - mean) / sqrt(var + eps) * scale + bias.
    if c.attrs.get("training_mode", 0) or len([o for o in c.node.output if o]) > 1:
        raise c.fail("only inference mode (training_mode=0, one output) is supported")
    x, scale, bias, mean, var = c.inputs[:5]
    # Parameters are (C,); for (N, C, D1..) inputs they broadcast as (C, 1, .., 1).
    expand = [-1] + [1] * (x.shape.rank - 2)
    scale, bias, mean, var = (tf.reshape(t, expand) for t in (scale, bias, mean, var))
    return [tf.nn.batch_normalization(x, mean, var, bias, scale, float(c.attrs.get("epsilon", 1e-5)))]


@register("Max")
def maximum(c: OpCall) -> list[Any]:
    return [functools.reduce(tf.math.maximum, c.inputs)]


@register("Min")
def minimum(c: OpCall) -> list[Any]:
    return [functools.reduce(tf.math.minimum, c.inputs)]
