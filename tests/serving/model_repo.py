"""Builds a small model repository (docs/design.md layout) from numpy weights, without the export stage.

The same weights go to model.onnx (onnx.helper, opset 17) and to a SavedModel (tf.Module), so both
backends can be checked against `reference_predict`, the numpy forward pass. A `calibrated` version serves
two outputs as export writes them since calibration: `ctr` = sigmoid(a z + b) (CALIBRATION = (a, b), a Platt
map of the logit z), then `raw_score` = sigmoid(z), today's `ctr` (`reference_outputs`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ctr_contract.signatures import DEFAULT_WIDTH
from ctr_features.spec import FeatureSpec

WIDTH = DEFAULT_WIDTH  # the width every default-trained version serves (ctr_contract)
HIDDEN = (32, 16)
CALIBRATION = (0.8, -0.3)  # (a, b) of a calibrated version's ctr = sigmoid(a z + b)
OUTPUTS = ("ctr", "raw_score")  # a calibrated version's outputs, in the manifest's order


def make_weights(seed: int) -> list[np.ndarray]:
    """[W1 (128,32), b1, W2 (32,16), b2, W3 (16,1), b3], float32; scaled so scores spread over (0, 1)."""
    rng = np.random.default_rng(seed)
    dims = (WIDTH, *HIDDEN, 1)
    weights = []
    for d_in, d_out in itertools.pairwise(dims):
        weights.append((rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(np.float32))
        weights.append((0.1 * rng.standard_normal(d_out)).astype(np.float32))
    return weights


def reference_logits(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """(N, 128) -> (N, 1) float64 logits z: relu(x W1 + b1) -> relu(. W2 + b2) -> . W3 + b3."""
    w1, b1, w2, b2, w3, b3 = (w.astype(np.float64) for w in weights)
    h = np.maximum(x.astype(np.float64) @ w1 + b1, 0)
    h = np.maximum(h @ w2 + b2, 0)
    return h @ w3 + b3


def reference_predict(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """(N, 128) -> (N, 1): sigmoid(z), the `ctr` of a one-output version (the `raw_score` of a calibrated one)."""
    return 1 / (1 + np.exp(-reference_logits(weights, x)))


def reference_outputs(weights: list[np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    """A calibrated version's outputs of (N, 128): {"ctr": sigmoid(a z + b), "raw_score": sigmoid(z)}, (N, 1) each."""
    z, (a, b) = reference_logits(weights, x), CALIBRATION
    return {"ctr": 1 / (1 + np.exp(-(a * z + b))), "raw_score": 1 / (1 + np.exp(-z))}


def write_onnx(weights: list[np.ndarray], path: Path, calibrated: bool = False) -> None:
    """Gemm -> Relu -> Gemm -> Relu -> Gemm -> Sigmoid, input `features` [N,128], output `ctr` [N,1];
    `calibrated`: outputs `ctr` = Sigmoid(a z + b) and `raw_score` = Sigmoid(z) instead, in that order."""
    names = ["w1", "b1", "w2", "b2", "w3", "b3"]
    inits = [numpy_helper.from_array(w, n) for w, n in zip(weights, names, strict=True)]
    nodes = [
        helper.make_node("Gemm", ["features", "w1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["a2"]),
        helper.make_node("Gemm", ["a2", "w3", "b3"], ["logits"]),
    ]
    if calibrated:
        a, b = (np.array(v, np.float32) for v in CALIBRATION)
        inits += [numpy_helper.from_array(a, "cal_a"), numpy_helper.from_array(b, "cal_b")]
        nodes += [
            helper.make_node("Sigmoid", ["logits"], ["raw_score"]),
            helper.make_node("Mul", ["logits", "cal_a"], ["scaled"]),
            helper.make_node("Add", ["scaled", "cal_b"], ["calibrated"]),
            helper.make_node("Sigmoid", ["calibrated"], ["ctr"]),
        ]
    else:
        nodes.append(helper.make_node("Sigmoid", ["logits"], ["ctr"]))
    graph = helper.make_graph(
        nodes,
        "ctr_mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", WIDTH])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 1])
            for name in (OUTPUTS if calibrated else OUTPUTS[:1])
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_saved_model(weights: list[np.ndarray], path: Path, calibrated: bool = False) -> None:
    """The same MLP as a SavedModel with signature serving_default: features -> {"ctr": ...}
    (`calibrated`: {"ctr": sigmoid(a z + b), "raw_score": sigmoid(z)})."""
    import tensorflow as tf

    class CTRModule(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = [tf.Variable(w) for w in weights]

        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="features")])
        def serve(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
            w1, b1, w2, b2, w3, b3 = self.w
            h = tf.nn.relu(tf.matmul(features, w1) + b1)
            h = tf.nn.relu(tf.matmul(h, w2) + b2)
            z = tf.matmul(h, w3) + b3
            if not calibrated:
                return {"ctr": tf.sigmoid(z)}
            a, b = CALIBRATION
            return {"ctr": tf.sigmoid(a * z + b), "raw_score": tf.sigmoid(z)}

    module = CTRModule()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def write_warmup(path: Path, batches: list[np.ndarray], model_name: str = "ctr") -> None:
    """TFRecord of PredictionLog{predict_log{request}}, written with TF's own writer and the stock protos."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for batch in batches:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.inputs["features"].CopyFrom(tf.make_tensor_proto(batch))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def write_manifest(
    version_dir: Path, version: int, outputs: tuple[str, ...] | None = None, raw: bool = False
) -> dict[str, str]:
    """Write `assets.extra/manifest.json` listing the sha256 of every other file, as export does; returns them.

    `outputs`: the `io` block export writes, naming these outputs (and the `raw` signature's, with `raw`);
    None: no `io` block, as in versions hand-built before it.
    """
    manifest_path = version_dir / "assets.extra" / "manifest.json"
    files = {
        p.relative_to(version_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(version_dir.rglob("*"))
        if p.is_file() and p != manifest_path
    }
    manifest: dict[str, object] = {
        "version": version,
        "inputs": {"features": [-1, WIDTH]},
        "outputs": {"ctr": [-1, 1]},
    }
    if outputs is not None:
        listed = {name: {"dtype": "float32", "shape": [-1, 1]} for name in outputs}
        io: dict[str, object] = {"signature": "serving_default", "outputs": listed}
        if raw:
            io["raw"] = {"signature": "raw", "outputs": listed}
        manifest["io"] = io
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps({**manifest, "files": files}))
    return files


def write_version(
    base: Path,
    version: int,
    weights: list[np.ndarray],
    saved_model_from: Path | None = None,
    calibrated: bool = False,
) -> Path:
    """Write `<base>/<version>/` (model.onnx, assets.extra/*; saved model copied from `saved_model_from`);
    `calibrated`: model.onnx serves `ctr` and `raw_score`, and the manifest's `io` lists both.

    Like the export stage, the folder is built under a temporary name and renamed into place, so a
    polling server never sees half a version.
    """
    tmp = base / f".tmp-{version}"
    shutil.rmtree(tmp, ignore_errors=True)
    if saved_model_from is not None:
        shutil.copytree(saved_model_from, tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    write_onnx(weights, tmp / "model.onnx", calibrated)
    extra = tmp / "assets.extra"
    extra.mkdir(exist_ok=True)
    (extra / "feature_spec.json").write_text(json.dumps({"width": WIDTH, "fields": []}))
    rng = np.random.default_rng(version)
    write_warmup(extra / "tf_serving_warmup_requests", [rng.random((n, WIDTH), np.float32) for n in (1, 4)])
    write_manifest(tmp, version, OUTPUTS if calibrated else None)
    final = base / str(version)
    tmp.rename(final)
    return final


def write_raw_version(base: Path, version: int, weights: list[np.ndarray], spec: FeatureSpec) -> Path:
    """`<base>/<version>/` serving `raw` too: model.onnx, model_raw.onnx (ctr_features/compiled/onnx_graph.py) and `spec`'s
    feature_spec.json, so our server runs raw rows through the FeatureSpec (serving/runtime/spec_backend.py)."""
    from ctr_features.compiled.onnx_graph import build_raw_model

    tmp = base / f".tmp-{version}"
    (tmp / "assets.extra").mkdir(parents=True)
    write_onnx(weights, tmp / "model.onnx")
    onnx.save(build_raw_model(onnx.load(str(tmp / "model.onnx")), spec), tmp / "model_raw.onnx")
    spec.save(tmp / "assets.extra" / "feature_spec.json")
    write_manifest(tmp, version)
    final = base / str(version)
    tmp.rename(final)
    return final
