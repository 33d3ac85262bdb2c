"""A tiny model repository for the server: a logistic model in model.onnx, features [N,128] -> ctr [N,1]."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 128


def write_logistic_model(version_dir: Path, weights: np.ndarray, bias: float) -> None:
    """Write version_dir/model.onnx computing ctr = sigmoid(features @ weights + bias)."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "w"], ["logit_nobias"]),  # (N,128) @ (128,1) -> (N,1)
            helper.make_node("Add", ["logit_nobias", "b"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["ctr"]),
        ],
        "ctr",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("ctr", TensorProto.FLOAT, ["N", 1])],
        initializer=[
            numpy_helper.from_array(weights.reshape(WIDTH, 1).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([bias], dtype=np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    version_dir.mkdir(parents=True)
    onnx.save(model, str(version_dir / "model.onnx"))
    # The server loads a version only once its manifest lists the sha256 of its files (as export writes it).
    digest = hashlib.sha256((version_dir / "model.onnx").read_bytes()).hexdigest()
    (version_dir / "assets.extra").mkdir()
    (version_dir / "assets.extra" / "manifest.json").write_text(json.dumps({"files": {"model.onnx": digest}}))


def expected_ctr(features: np.ndarray, weights: np.ndarray, bias: float) -> np.ndarray:
    """What the model answers, computed in float64: (N,128) -> (N,1)."""
    logits = features.astype(np.float64) @ weights.astype(np.float64).reshape(-1, 1) + bias
    return 1.0 / (1.0 + np.exp(-logits))
