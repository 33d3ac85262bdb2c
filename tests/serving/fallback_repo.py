"""Versions for the circuit-breaking tests: a good MLP, and a broken one that fails on "poison" rows only.

The broken version serves the same MLP (tests/serving/model_repo.py) plus two terms that are 0 on ordinary rows:
`0 * Sqrt(NAN_ABOVE - x0)`, NaN once feature 0 is above NAN_ABOVE, and a Gather from a two-element table at
index floor(x0 / 100), which ONNX Runtime refuses (an error, not a NaN) once feature 0 reaches ERROR_AT. Its
warm-up row (zeros) and every row with x0 <= NAN_ABOVE score exactly as the plain MLP does. No warm-up file
and no TensorFlow: the versions are written in milliseconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.serving.model_repo import WIDTH, write_manifest, write_onnx

NAN_ABOVE = 10.0  # x0 above this: the broken version's output is NaN
ERROR_AT = 200.0  # x0 from this on: the broken version's run fails


def write_good_version(base: Path, version: int, weights: list[np.ndarray]) -> Path:
    """`<base>/<version>/`: the plain MLP of `weights`."""
    return _publish(base, version, lambda path: write_onnx(weights, path))


def write_broken_version(base: Path, version: int, weights: list[np.ndarray]) -> Path:
    """`<base>/<version>/`: the MLP of `weights`, NaN for x0 > NAN_ABOVE and an error for x0 >= ERROR_AT."""

    def write(path: Path) -> None:
        write_onnx(weights, path)
        model = onnx.load(str(path))
        graph = model.graph
        for node in graph.node:  # the MLP's output becomes an inner value
            node.output[:] = ["mlp" if out == "ctr" else out for out in node.output]
        consts = {
            "starts": np.array([0], np.int64),
            "ends": np.array([1], np.int64),
            "axes": np.array([1], np.int64),
            "limit": np.array(NAN_ABOVE, np.float32),
            "zero": np.array(0.0, np.float32),
            "hundred": np.array(100.0, np.float32),
            "table": np.zeros(2, np.float32),
        }
        graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
        graph.node.extend(
            [
                helper.make_node("Slice", ["features", "starts", "ends", "axes"], ["x0"]),  # (N, 1)
                helper.make_node("Sub", ["limit", "x0"], ["room"]),
                helper.make_node("Sqrt", ["room"], ["root"]),  # NaN where x0 > limit
                helper.make_node("Mul", ["root", "zero"], ["nan_term"]),
                helper.make_node("Div", ["x0", "hundred"], ["scaled"]),
                helper.make_node("Floor", ["scaled"], ["floored"]),
                helper.make_node("Cast", ["floored"], ["index"], to=TensorProto.INT64),
                helper.make_node(
                    "Gather", ["table", "index"], ["error_term"], axis=0
                ),  # fails for index >= 2
                helper.make_node("Add", ["mlp", "nan_term"], ["with_nan"]),
                helper.make_node("Add", ["with_nan", "error_term"], ["ctr"]),
            ]
        )
        onnx.checker.check_model(model)
        onnx.save(model, str(path))

    return _publish(base, version, write)


def rows(x0: float, n: int = 1, seed: int = 0) -> np.ndarray:
    """(n, WIDTH) rows in [0, 1) with feature 0 set to `x0`."""
    batch = np.random.default_rng(seed).random((n, WIDTH), np.float32)
    batch[:, 0] = x0
    return batch


def _publish(base: Path, version: int, write_model) -> Path:  # type: ignore[no-untyped-def]
    tmp = base / f".tmp-{version}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "assets.extra").mkdir(parents=True)
    write_model(tmp / "model.onnx")
    (tmp / "assets.extra" / "feature_spec.json").write_text(json.dumps({"width": WIDTH, "fields": []}))
    write_manifest(tmp, version)
    final = base / str(version)
    tmp.rename(final)
    return final
