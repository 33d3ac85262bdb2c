"""Our ONNX -> TF translator, op by op, against ONNX Runtime on hand-built graphs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.errors import UnsupportedOpError
from export.onnx.targets import TRANSLATOR_OPS
from export.tf.tf_ops import TF_OPS
from export.tf.translator import OnnxModule

RNG = np.random.default_rng(7)


def _w(*shape: int, name: str = "w", positive: bool = False) -> onnx.TensorProto:
    arr = RNG.uniform(0.5, 2.0, shape) if positive else RNG.normal(size=shape)
    return numpy_helper.from_array(arr.astype(np.float32), name)


def _ints(values: Sequence[int], name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _graph(
    nodes: list[onnx.NodeProto], in_shape: list, out_shape: list, inits: Sequence[onnx.TensorProto] = ()
) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "case",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        initializer=list(inits),
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


N = "N"
CASES: dict[str, onnx.ModelProto] = {
    "Gemm": _graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], alpha=0.5, beta=2.0, transB=1)],
        [N, 4],
        [N, 3],
        [_w(3, 4), _w(3, name="b")],
    ),
    "MatMul": _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], [N, 4], [N, 3], [_w(4, 3)]),
    "Add": _graph([helper.make_node("Add", ["x", "w"], ["y"])], [N, 4], [N, 4], [_w(4)]),
    "Sub": _graph([helper.make_node("Sub", ["w", "x"], ["y"])], [N, 4], [N, 4], [_w(1, 4)]),
    "Mul": _graph([helper.make_node("Mul", ["x", "w"], ["y"])], [N, 4], [N, 4], [_w(4)]),
    "Div": _graph([helper.make_node("Div", ["x", "w"], ["y"])], [N, 4], [N, 4], [_w(4, positive=True)]),
    "Relu": _graph([helper.make_node("Relu", ["x"], ["y"])], [N, 4], [N, 4]),
    "LeakyRelu": _graph([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.2)], [N, 4], [N, 4]),
    "Clip": _graph(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])],
        [N, 4],
        [N, 4],
        [
            numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
            numpy_helper.from_array(np.array(0.7, np.float32), "hi"),
        ],
    ),
    "Sigmoid": _graph([helper.make_node("Sigmoid", ["x"], ["y"])], [N, 4], [N, 4]),
    "Tanh": _graph([helper.make_node("Tanh", ["x"], ["y"])], [N, 4], [N, 4]),
    "Identity": _graph([helper.make_node("Identity", ["x"], ["y"])], [N, 4], [N, 4]),
    "Dropout": _graph(
        [helper.make_node("Dropout", ["x", "ratio"], ["y"])],
        [N, 4],
        [N, 4],
        [numpy_helper.from_array(np.array(0.3, np.float32), "ratio")],
    ),
    "Constant": _graph(
        [
            helper.make_node(
                "Constant", [], ["c"], value=numpy_helper.from_array(np.arange(4, dtype=np.float32), "c")
            ),
            helper.make_node("Mul", ["x", "c"], ["y"]),
        ],
        [N, 4],
        [N, 4],
    ),
    "Flatten": _graph([helper.make_node("Flatten", ["x"], ["y"], axis=1)], [N, 2, 3], [N, 6]),
    "Reshape": _graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], [N, 6], [N, 2, 3], [_ints([0, 2, -1], "shape")]
    ),
    "Concat": _graph([helper.make_node("Concat", ["x", "x"], ["y"], axis=-1)], [N, 4], [N, 8]),
    "BatchNormalization": _graph(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
        [N, 3, 2],
        [N, 3, 2],
        [_w(3, name="s"), _w(3, name="b"), _w(3, name="m"), _w(3, name="v", positive=True)],
    ),
    "Max": _graph([helper.make_node("Max", ["x", "w"], ["y"])], [N, 4], [N, 4], [_w(4)]),
    "Min": _graph([helper.make_node("Min", ["x", "w"], ["y"])], [N, 4], [N, 4], [_w(4)]),
}


def test_every_translator_op_has_a_case_and_a_registry_entry() -> None:
    assert set(CASES) == set(TF_OPS) == TRANSLATOR_OPS


@pytest.mark.parametrize("op", sorted(CASES))
def test_translated_op_matches_onnxruntime(op: str) -> None:
    model = CASES[op]
    dims = [d.dim_value or 5 for d in model.graph.input[0].type.tensor_type.shape.dim]  # batch 5
    x = (RNG.normal(size=dims) * 3).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = OnnxModule(model).serve(x)["y"].numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_translator_rejects_unknown_op_naming_op_node_and_supported_set() -> None:
    model = _graph([helper.make_node("Softmax", ["x"], ["y"], name="head_softmax")], [N, 4], [N, 4])
    with pytest.raises(UnsupportedOpError) as err:
        OnnxModule(model)
    message = str(err.value)
    assert "ONNX op 'Softmax' (node 'head_softmax', domain 'ai.onnx') has no TF translation" in message
    assert f"the translator supports {sorted(TF_OPS)}" in message


def test_translator_rejects_dropout_in_training_mode() -> None:
    model = _graph(
        [helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop")],
        [N, 4],
        [N, 4],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "r"),
            numpy_helper.from_array(np.array(True), "t"),
        ],
    )
    with pytest.raises(
        UnsupportedOpError, match=r"ONNX node 'drop' \(Dropout\): training_mode must be a constant False"
    ):
        OnnxModule(model).serve(np.zeros((2, 4), np.float32))
