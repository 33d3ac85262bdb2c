"""Our ONNX -> TF SavedModel translator: the ONNX graph becomes a `tf.Module` with a serving signature.

Float initializers become non-trainable `tf.Variable`s (saved under `variables/`); integer initializers
(shapes, axes) become constants so ops like Reshape see them at trace time. Ops map through `tf_ops.TF_OPS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import tensorflow as tf
from onnx import helper, numpy_helper

from ctr_contract.signatures import DEFAULT_SIGNATURE
from export.errors import UnsupportedOpError
from export.tf.tf_ops import TF_OPS, OpCall

SIGNATURE_KEY = DEFAULT_SIGNATURE
_TF_DTYPES: dict[int, tf.DType] = {onnx.TensorProto.FLOAT: tf.float32, onnx.TensorProto.DOUBLE: tf.float64}


def check_translatable(proto: onnx.ModelProto) -> None:
    """Fail before tracing if any node's op has no TF translation."""
    for node in proto.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in TF_OPS:
            raise UnsupportedOpError(
                f"ONNX op {node.op_type!r} (node {node.name!r}, domain {node.domain or 'ai.onnx'!r}) has no TF "
                f"translation; the translator supports {sorted(TF_OPS)}"
            )


def _spec(value: onnx.ValueInfoProto) -> tf.TensorSpec:
    t = value.type.tensor_type
    if t.elem_type not in _TF_DTYPES:
        raise UnsupportedOpError(
            f"graph input {value.name!r} has type {onnx.TensorProto.DataType.Name(t.elem_type)}; expected FLOAT or DOUBLE"
        )
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return tf.TensorSpec(dims, _TF_DTYPES[t.elem_type], name=value.name)


class OnnxModule(tf.Module):
    """A tf.Module computing an ONNX graph; `serve` is the tf.function behind `serving_default`."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        super().__init__(name="onnx_model")
        check_translatable(proto)
        graph = proto.graph
        weight_names = {t.name for t in graph.initializer}
        inputs = [v for v in graph.input if v.name not in weight_names]
        if len(inputs) != 1:
            raise UnsupportedOpError(
                f"the translator takes single-input graphs; got inputs {[v.name for v in inputs]}"
            )
        self._nodes = list(graph.node)
        self._input_name = inputs[0].name
        self._outputs = [(v.name, _spec(v).shape) for v in graph.output]
        self._constants: dict[str, Any] = {}
        self._weight_index: dict[str, int] = {}
        self.weights: list[tf.Variable] = []  # tracked by tf.Module, so saved under variables/
        for init in graph.initializer:
            arr = numpy_helper.to_array(init)
            if arr.dtype.kind == "f":
                self._weight_index[init.name] = len(self.weights)
                self.weights.append(tf.Variable(arr, trainable=False, name=f"w{len(self.weights)}"))
            else:
                self._constants[init.name] = arr
        self.serve = tf.function(self._run, input_signature=[_spec(inputs[0])])

    def _value(self, name: str, env: dict[str, Any]) -> Any:
        if not name:
            return None  # an omitted optional input
        if name in env:
            return env[name]
        if name in self._weight_index:
            return self.weights[self._weight_index[name]]
        if name in self._constants:
            return tf.constant(self._constants[name])
        raise UnsupportedOpError(f"ONNX value {name!r} is used before any node produces it")

    def _run(self, *args: tf.Tensor) -> dict[str, tf.Tensor]:
        env: dict[str, Any] = {self._input_name: args[0]}
        for node in self._nodes:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            call = OpCall(node, [self._value(n, env) for n in node.input], attrs)
            results = TF_OPS[node.op_type](call)
            for name, tensor in zip(node.output, results, strict=False):
                if name:
                    env[name] = tensor
        # ensure_shape pins the ONNX output shape, e.g. (-1, 1), into the serving signature.
        return {name: tf.ensure_shape(env[name], shape) for name, shape in self._outputs}


def save_saved_model(proto: onnx.ModelProto, directory: Path) -> None:
    """Translate `proto` and write a SavedModel (saved_model.pb + variables/) into `directory`."""
    module = OnnxModule(proto)
    signature = module.serve.get_concrete_function()
    tf.saved_model.save(module, str(directory), signatures={SIGNATURE_KEY: signature})
