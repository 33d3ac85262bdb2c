"""Exported relu and hardtanh models: ONNX graph, SavedModel signature, parity after reload, version assets.

Every graph ends in the version's calibrator (assets.extra/calibration.json) and has two outputs: the calibrated
`ctr` and the network's `raw_score`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from ctr_model.calibration import Calibrator
from ctr_model.checkpoint import load_net
from export.gates.runtimes import (
    onnxruntime_predictor,
    savedmodel_predictor,
    torch_predictor,
    torchscript_predictor,
)
from export.tf.warmup import read_warmup

CASES = [("relu", "standard"), ("hardtanh", "standard"), ("hardtanh", "minimal")]
EXPECTED_OPS = {  # the network, then raw_score = Sigmoid(z)
    ("relu", "standard"): ["Gemm", "Relu", "Gemm", "Relu", "Gemm", "Sigmoid"],
    ("hardtanh", "standard"): ["Gemm", "Clip", "Gemm", "Clip", "Gemm", "Sigmoid"],
    # min + relu((max - min) - relu(max - x)) per Hardtanh: Sub, Relu, Sub, Relu, Add
    ("hardtanh", "minimal"): ["Gemm"] + ["Sub", "Relu", "Sub", "Relu", "Add", "Gemm"] * 2 + ["Sigmoid"],
}
CALIBRATOR_OPS = {  # then ctr, with w = 1: sigmoid(a z + b); y0 + sum_k s_k (relu(q - lo_k) - relu(q - hi_k))
    "platt": ["Mul", "Add", "Sigmoid"],
    "isotonic": ["Sub", "Relu", "Sub", "Relu", "Sub", "MatMul", "Add"],
    "none": ["Identity"],
}
OUTPUT_INFO = """    outputs['ctr'] tensor_info:
        dtype: DT_FLOAT
        shape: (-1, 1)
        name: StatefulPartitionedCall{call}:0
    outputs['raw_score'] tensor_info:
        dtype: DT_FLOAT
        shape: (-1, 1)
        name: StatefulPartitionedCall{call}:1
  Method name is: tensorflow/serving/predict"""
SAVED_MODEL_CLI = Path(sys.executable).with_name("saved_model_cli")
SIGNATURE = """signature_def['serving_default']:
  The given SavedModel SignatureDef contains the following input(s):
    inputs['features'] tensor_info:
        dtype: DT_FLOAT
        shape: (-1, 128)
        name: serving_default_features:0
  The given SavedModel SignatureDef contains the following output(s):
""" + OUTPUT_INFO.format(call="_1")


def _manifest(version_dir: Path) -> dict:
    return json.loads((version_dir / "assets.extra" / "manifest.json").read_text())


def calibrator_of(version_dir: Path) -> Calibrator:
    """The calibrator a version's graphs apply, read back from assets.extra/calibration.json."""
    return Calibrator.from_dict(json.loads((version_dir / "assets.extra" / "calibration.json").read_text()))


@pytest.mark.parametrize(("activation", "target"), CASES)
def test_onnx_graph_has_contract_io_opset_and_target_ops(published, activation: str, target: str) -> None:
    path = published(activation, target).version_dir / "model.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    (inp,), outs = model.graph.input, model.graph.output
    assert (inp.name, [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]) == (
        "features",
        ["batch", 128],
    )
    assert [(o.name, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]) for o in outs] == [
        ("ctr", ["batch", 1]),
        ("raw_score", ["batch", 1]),
    ]
    types = {inp.type.tensor_type.elem_type} | {o.type.tensor_type.elem_type for o in outs}
    assert types == {onnx.TensorProto.FLOAT}
    method = calibrator_of(path.parent).method
    assert [n.op_type for n in model.graph.node] == EXPECTED_OPS[(activation, target)] + CALIBRATOR_OPS[
        method
    ]
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in model.graph.initializer)
    assert sorted(p.name for p in path.parent.iterdir() if p.is_file()) == [
        "fingerprint.pb",
        "model.onnx",
        "model.pt",
        "model_raw.onnx",
        "saved_model.pb",
    ]


def test_hardtanh_for_target_without_clip_has_no_clip_node(published) -> None:
    version_dir = published("hardtanh", "minimal").version_dir
    ops = {n.op_type for n in onnx.load(str(version_dir / "model.onnx")).graph.node}
    assert "Clip" not in ops
    patches = _manifest(version_dir)["op_patches"]
    assert [(p["op"], p["module"]) for p in patches] == [("Clip", "layers.1"), ("Clip", "layers.4")]


@pytest.mark.parametrize(("activation", "target"), [("relu", "standard"), ("hardtanh", "minimal")])
def test_saved_model_cli_shows_exact_serving_signature(published, activation: str, target: str) -> None:
    version_dir = published(activation, target).version_dir
    shown = subprocess.run(
        [str(SAVED_MODEL_CLI), "show", "--all", "--dir", str(version_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert SIGNATURE in shown.stdout
    raw = shown.stdout[shown.stdout.index("signature_def['raw']") :]
    assert OUTPUT_INFO.format(call="") in raw[: raw.index("signature_def['serving_default']")]


def _parity_rows(width: int = 128) -> np.ndarray:
    """Normal rows plus ±50 sign patterns that saturate every hidden unit and the sigmoid."""
    rng = np.random.default_rng(42)
    normal = rng.normal(0, 3, size=(3000, width))
    extreme = 50.0 * rng.choice([-1.0, 1.0], size=(1000, width))
    return np.concatenate([normal, extreme]).astype(np.float32)


@pytest.mark.parametrize(("activation", "target"), CASES)
def test_reloaded_onnxruntime_and_savedmodel_match_pytorch(published, activation: str, target: str) -> None:
    p = published(activation, target)
    net, _ = load_net(p.run / "checkpoints" / "best.ckpt")  # the unpatched model is the reference
    calibrator, both = calibrator_of(p.version_dir), ("ctr", "raw_score")
    x = _parity_rows()
    reference = torch_predictor(net, calibrator, outputs=both)(x)
    z = net(torch.from_numpy(x)).detach().numpy().astype(np.float64)
    np.testing.assert_allclose(
        reference[:, :1], calibrator.apply(z), rtol=0, atol=1e-6
    )  # the numpy reference
    for name, predict in (
        ("onnxruntime", onnxruntime_predictor(p.version_dir / "model.onnx", outputs=both)),
        ("savedmodel", savedmodel_predictor(p.version_dir, outputs=both)),
        ("torchscript", torchscript_predictor(p.version_dir / "model.pt", outputs=both)),
    ):
        got = predict(x)
        assert got.shape == (len(x), 2), name
        assert float(np.abs(got - reference).max()) <= 1e-5, name
    raw_score = torch.sigmoid(net(torch.from_numpy(x))).detach().numpy()
    assert float(np.abs(reference[:, 1:] - raw_score).max()) == 0.0  # the network's own probability


@pytest.mark.parametrize(("activation", "target"), CASES)
def test_manifest_records_source_metrics_io_and_parity(published, activation: str, target: str) -> None:
    p = published(activation, target)
    m = _manifest(p.version_dir)
    ckpt = p.run / "checkpoints" / "best.ckpt"
    assert m["version"] == 1
    assert m["source_checkpoint"]["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert (m["source_checkpoint"]["epoch"], m["source_checkpoint"]["global_step"]) == (3, 120)
    assert m["source_checkpoint"]["model"]["activation"] == activation
    metrics = json.loads((p.run / "metrics.json").read_text())
    written = metrics.pop("calibration")  # export's figures, added to the run's metrics.json
    assert m["training_metrics"] == metrics
    assert (written["version"], written["method"]) == (1, m["calibration"]["method"])
    assert written["after"] == m["calibration"]["report"]["after"]
    assert written["gate"]["calibration_ratio"] == m["quality_gate"]["candidate"]["calibration_ratio"]
    assert m["opset"] == 17
    assert m["io"]["inputs"] == {
        "features": {"dtype": "float32", "shape": [-1, 128], "onnx_shape": ["batch", 128]}
    }
    output = {"dtype": "float32", "shape": [-1, 1], "onnx_shape": ["batch", 1]}
    assert list(m["io"]["outputs"].items()) == [("ctr", output), ("raw_score", output)]
    raw_output = {"dtype": "float32", "shape": [-1, 1]}
    assert list(m["io"]["raw"]["outputs"].items()) == [("ctr", raw_output), ("raw_score", raw_output)]
    calibration = json.loads((p.version_dir / "assets.extra" / "calibration.json").read_text())
    assert m["calibration"] == calibration and calibration["report"]["method"] == calibration["method"]
    assert m["target"]["name"] == target
    assert m["packages"]["torch"] == torch.__version__
    parity = m["parity"]
    assert parity["passed"] is True and parity["tolerance"] == 1e-5
    assert parity["rows"] == 10_000 and parity["groups"]["validation"] == 2_000
    assert set(parity["max_abs_diff_by_pair"]) == {
        "pytorch_vs_torchscript",
        "pytorch_vs_onnxruntime",
        "pytorch_vs_savedmodel",
        "torchscript_vs_onnxruntime",
        "torchscript_vs_savedmodel",
        "onnxruntime_vs_savedmodel",
    }
    assert 0 <= parity["max_abs_diff"] <= 1e-5
    assert parity["outputs"] == ["ctr", "raw_score"]
    for out in ("ctr", "raw_score"):
        pairs = parity["by_output"][out]["max_abs_diff_by_pair"]
        assert set(pairs) == set(parity["max_abs_diff_by_pair"]) and max(pairs.values()) <= 1e-5
    for name, layer in parity["saturation"].items():  # the extreme rows saturate every hidden unit
        assert layer["saturated_low"] == layer["units"], name
        assert layer["saturated_high"] in (None, layer["units"]), name
    for rel, digest in m["files"].items():
        assert hashlib.sha256((p.version_dir / rel).read_bytes()).hexdigest() == digest, rel


def test_feature_spec_is_copied_into_assets_extra(published) -> None:
    p = published("relu")
    copied = p.version_dir / "assets.extra" / "feature_spec.json"
    assert copied.read_bytes() == (p.run / "feature_spec.json").read_bytes()


def test_warmup_requests_are_prediction_logs_the_savedmodel_answers(published) -> None:
    import tensorflow as tf

    p = published("relu")
    logs = read_warmup(p.version_dir / "assets.extra" / "tf_serving_warmup_requests")
    val = np.load(p.run / "val_features.npy")
    predict = savedmodel_predictor(p.version_dir)
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log"] * 6
    # Three for serving_default, then three for the raw signature (tests/export/test_export_raw.py).
    assert [log.predict_log.request.model_spec.signature_name for log in logs[3:]] == ["raw"] * 3
    for log, batch in zip(logs[:3], (1, 8, 64), strict=True):
        request = log.predict_log.request
        assert (request.model_spec.name, request.model_spec.signature_name) == ("ctr", "serving_default")
        features = tf.make_ndarray(request.inputs["features"])
        np.testing.assert_array_equal(features, val[:batch])
        assert predict(features).shape == (batch, 1)
        assert not log.predict_log.HasField("response")  # only the raw records carry the expected scores


def test_triton_config_sits_beside_versions(published) -> None:
    text = (published("relu").repo / "config.pbtxt").read_text()
    assert 'name: "ctr"' in text
    assert 'platform: "onnxruntime_onnx"' in text
    assert "max_batch_size: 1024" in text
    assert 'name: "features"\n    data_type: TYPE_FP32\n    dims: [ 128 ]' in text
    assert (
        'output [\n  {\n    name: "ctr"\n    data_type: TYPE_FP32\n    dims: [ 1 ]\n  },\n  {\n    name: "raw_score"'
        in text
    )
    assert "dynamic_batching {" in text


def test_opset_other_than_requested_is_rejected(published) -> None:
    from export.errors import ExportError
    from export.onnx.onnx_export import verify_contract

    model = onnx.load(str(published("relu").version_dir / "model.onnx"))
    verify_contract(model, width=128, opset=17)
    model.opset_import[0].version = 18  # what the exporter keeps when down-conversion fails
    with pytest.raises(ExportError, match=r"^exported ONNX carries opset 18, expected 17$"):
        verify_contract(model, width=128, opset=17)
    with pytest.raises(
        ExportError,
        match=r"^ONNX input 'features' is FLOAT \['batch', 128\], expected FLOAT \['batch', 64\]$",
    ):
        verify_contract(model, width=64, opset=18)
