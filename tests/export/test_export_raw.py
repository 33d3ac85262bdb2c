"""The `raw` signature of an exported version: Criteo fields in, the FeatureSpec applied inside the graph.

Four-way parity (FeatureSpec.transform + PyTorch, ONNX Runtime on model_raw.onnx, the SavedModel's `raw`
signature, our server's compiled FeatureSpec + model.onnx) on a published version, the expected scores in the
raw warm-up records, the gate refusing a disagreeing backend, and the SavedModel called with
exactly the tensors TF Serving's REST layer builds from the documented JSON (stock TF Serving cannot run here).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS, RAW_FIELDS
from ctr_features.parity import build_raw_rows
from ctr_features.spec import FeatureSpec
from ctr_model.calibration import Calibrator
from ctr_model.checkpoint import load_net
from export.errors import ExportError, ParityError
from export.gates.parity import MIN_ROWS
from export.gates.raw_parity import (
    load_val_raw,
    onnxruntime_raw_predictor,
    python_predictor,
    run_raw_gate,
    savedmodel_raw_predictor,
    serving_predictor,
)
from export.gates.runtimes import onnxruntime_predictor, torch_predictor
from export.raw_graphs import build_raw_model
from serving.repository.warmup import RawWarmup, warmup_batches

STRESS_GROUPS = (
    "validation",
    "vocabulary",
    "unseen",
    "all_missing",
    "extreme_counts",
    "odd_strings",
    "random",
)


OUTPUTS = ("ctr", "raw_score")


@pytest.fixture(scope="module")
def version(published: Callable[[str, str], Any]) -> Any:
    """The session's (relu, standard) export: `.run`, `.repo`, `.version_dir`."""
    return published("relu", "standard")


def reference(version: Any) -> Callable[[np.ndarray], np.ndarray]:
    """The version's network and calibrator in PyTorch: features -> (ctr, raw_score) columns (N, 2)."""
    net, _ = load_net(version.run / "checkpoints" / "best.ckpt")
    doc = json.loads((version.version_dir / "assets.extra" / "calibration.json").read_text())
    return torch_predictor(net, Calibrator.from_dict(doc), outputs=OUTPUTS)


def test_published_version_has_the_raw_graph_and_its_gate_report(version: Any) -> None:
    manifest = json.loads((version.version_dir / "assets.extra" / "manifest.json").read_text())
    raw = manifest["parity"]["raw"]
    assert raw["passed"] is True and raw["rows"] >= MIN_ROWS and raw["max_abs_diff"] <= 1e-5
    assert tuple(raw["groups"]) == STRESS_GROUPS
    assert raw["groups"]["validation"] == 2_000  # every row of the run's val_raw.npz
    assert set(raw["max_abs_diff_by_pair"]) == {
        "python_vs_onnxruntime_raw",
        "python_vs_savedmodel_raw",
        "python_vs_serving_transform",
        "onnxruntime_raw_vs_savedmodel_raw",
        "onnxruntime_raw_vs_serving_transform",
        "savedmodel_raw_vs_serving_transform",
    }
    assert manifest["io"]["raw"]["onnx_file"] == "model_raw.onnx"
    assert "model_raw.onnx" in manifest["files"]
    proto = onnx.load(str(version.version_dir / "model_raw.onnx"))
    assert [i.name for i in proto.graph.input] == list(RAW_FIELDS)
    types = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
    assert {types[f] for f in NUMERIC_FIELDS} == {onnx.TensorProto.DOUBLE}
    assert {types[f] for f in CATEGORICAL_FIELDS} == {onnx.TensorProto.STRING}
    assert {n.domain for n in proto.graph.node} == {"", "ai.onnx.ml"}  # standard domains, no custom op
    assert "ai.onnx.ml::LabelEncoder" in manifest["io"]["raw"]["onnx_ops"]


def test_three_way_parity_on_the_published_version(version: Any) -> None:
    spec = FeatureSpec.load(version.version_dir / "assets.extra" / "feature_spec.json")
    rows, groups = build_raw_rows(spec, MIN_ROWS, load_val_raw(version.run / "val_raw.npz"), seed=7)
    backends = {
        "python": python_predictor(spec, reference(version)),
        "onnxruntime_raw": onnxruntime_raw_predictor(version.version_dir / "model_raw.onnx", outputs=OUTPUTS),
        "savedmodel_raw": savedmodel_raw_predictor(version.version_dir, outputs=OUTPUTS),
        "serving_transform": serving_predictor(
            spec, onnxruntime_predictor(version.version_dir / "model.onnx", outputs=OUTPUTS)
        ),
    }
    report = run_raw_gate(spec, rows, groups, backends, 1e-5)
    assert report["rows"] == MIN_ROWS and report["passed"]
    assert report["max_abs_diff"] <= 1e-5 and report["outputs"] == list(OUTPUTS)
    assert max(report["by_output"]["raw_score"]["max_abs_diff_by_pair"].values()) <= 1e-5
    # Every stress group moves the prediction: the rows reach different parts of the graph.
    ctr = backends["python"](*rows)[:, 0]
    assert len({round(float(ctr[groups[g]].mean()), 6) for g in STRESS_GROUPS}) == len(STRESS_GROUPS)


def warmup_batches_with_raw(version_dir: Any) -> list[RawWarmup]:
    records: list[RawWarmup] = []
    warmup_batches(version_dir, "features", records)
    return records


def test_raw_warmup_records_carry_the_python_paths_scores_for_the_load_gate(version: Any) -> None:
    spec = FeatureSpec.load(version.version_dir / "assets.extra" / "feature_spec.json")
    python = python_predictor(spec, reference(version))
    records = warmup_batches_with_raw(version.version_dir)
    assert [len(r.batch) for r in records] == [1, 8, 64]
    for record in records:
        batch = record.batch
        expected = python(batch.numeric.T, batch.categorical.T)
        assert record.expected is not None and sorted(record.expected) == sorted(OUTPUTS)
        for j, name in enumerate(OUTPUTS):  # both outputs, (N, 1) each
            np.testing.assert_allclose(record.expected[name], expected[:, j : j + 1], rtol=0, atol=1e-6)


def test_gate_refuses_a_raw_backend_that_disagrees(version: Any) -> None:
    spec = FeatureSpec.load(version.version_dir / "assets.extra" / "feature_spec.json")
    rows, groups = build_raw_rows(spec, MIN_ROWS, None)
    python = python_predictor(spec, reference(version))

    for column in (0, 1):  # a wrong ctr (the calibrator) or a wrong raw_score alone fails the gate

        def off_on_missing(numeric: np.ndarray, categorical: np.ndarray, column: int = column) -> np.ndarray:
            out = python(numeric, categorical).copy()
            out[groups["all_missing"], column] += 2e-5  # e.g. a graph that forgot that NaN counts are missing
            return out

        with pytest.raises(
            ParityError, match=r"raw-signature parity failed: max abs difference 2e-05 > tolerance 1e-05"
        ):
            run_raw_gate(spec, rows, groups, {"python": python, "broken": off_on_missing}, 1e-5)


# The documented stock-TF-Serving request: every field in every instance; a missing count is the NaN token
# (TF Serving's JSON parser accepts NaN; there is no null for numbers) and a missing categorical is "".
TF_SERVING_BODY = """{"signature_name": "raw", "instances": [
 {"I1": 3, "I2": -1, "I3": 1234567, "I4": NaN, "I5": 0, "I6": 12, "I7": 1, "I8": 2, "I9": 40, "I10": NaN,
  "I11": 1, "I12": NaN, "I13": 4, "C1": "68fd1e64", "C2": "80e26c9b", "C3": "fb936136", "C4": "7b4723c4",
  "C5": "25c83c98", "C6": "7e0ccccf", "C7": "de7995b8", "C8": "1f89b562", "C9": "a73ee510", "C10": "a8cd5504",
  "C11": "b2cb9c98", "C12": "37c9c164", "C13": "2824a5f6", "C14": "1adce6ef", "C15": "8ba8b39a",
  "C16": "891b62e7", "C17": "e5ba7672", "C18": "f54016b9", "C19": "21ddcdc9", "C20": "b1252a9d",
  "C21": "07b5194c", "C22": "", "C23": "3a171ecb", "C24": "c5c50484", "C25": "e8b83407", "C26": "9727dd16"},
 {"I1": NaN, "I2": NaN, "I3": NaN, "I4": NaN, "I5": NaN, "I6": NaN, "I7": NaN, "I8": NaN, "I9": NaN,
  "I10": NaN, "I11": NaN, "I12": NaN, "I13": NaN, "C1": "", "C2": "", "C3": "", "C4": "", "C5": "", "C6": "",
  "C7": "", "C8": "", "C9": "", "C10": "", "C11": "", "C12": "", "C13": "", "C14": "", "C15": "", "C16": "",
  "C17": "", "C18": "", "C19": "", "C20": "", "C21": "", "C22": "", "C23": "", "C24": "", "C25": "", "C26": ""}
]}"""


def test_savedmodel_raw_signature_takes_the_tensors_tf_serving_builds_from_json(version: Any) -> None:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(version.version_dir))
    signature = loaded.signatures["raw"]
    specs = signature.structured_input_signature[1]
    assert sorted(specs) == sorted(RAW_FIELDS)
    assert {specs[f].dtype for f in NUMERIC_FIELDS} == {tf.float64}
    assert {specs[f].dtype for f in CATEGORICAL_FIELDS} == {tf.string}
    assert set(loaded.signatures) == {"serving_default", "raw"}
    instances = json.loads(TF_SERVING_BODY)["instances"]
    # TF Serving's row format: one tensor per input, the instances' values stacked along the batch dimension,
    # typed by the signature (numbers -> DT_DOUBLE, strings -> DT_STRING).
    tensors = {f: tf.constant([row[f] for row in instances], dtype=specs[f].dtype) for f in RAW_FIELDS}
    result = signature(**tensors)
    got = np.concatenate([result[name].numpy() for name in OUTPUTS], axis=1)

    spec = FeatureSpec.load(version.version_dir / "assets.extra" / "feature_spec.json")
    numeric = np.array([[row[f] for f in NUMERIC_FIELDS] for row in instances], dtype=np.float64)
    categorical = np.array([[row[f] for f in CATEGORICAL_FIELDS] for row in instances], dtype=object)
    want = reference(version)(spec.transform(numeric, categorical))
    assert sorted(result) == sorted(OUTPUTS) and got.shape == (2, 2)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_raw_graph_refuses_a_model_below_opset_13(version: Any) -> None:
    spec = FeatureSpec.load(version.version_dir / "assets.extra" / "feature_spec.json")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["features"], ["ctr"])],
        "old",
        [onnx.helper.make_tensor_value_info("features", onnx.TensorProto.FLOAT, ["batch", 128])],
        [onnx.helper.make_tensor_value_info("ctr", onnx.TensorProto.FLOAT, ["batch", 128])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 12)])
    with pytest.raises(
        ExportError,
        match=r"^the raw graph needs ai.onnx opset >= 13 .* the model has 12; export with --opset 13 or newer$",
    ):
        build_raw_model(model, spec)


def test_warmup_file_holds_raw_requests_the_savedmodel_answers(version: Any) -> None:
    import tensorflow as tf

    from export.tf.warmup import read_warmup

    logs = read_warmup(version.version_dir / "assets.extra" / "tf_serving_warmup_requests")[3:]
    signature = tf.saved_model.load(str(version.version_dir)).signatures["raw"]
    with np.load(version.run / "val_raw.npz") as z:
        numeric, categorical = z["numeric"], z["categorical"]
    for log, batch in zip(logs, (1, 8, 64), strict=True):
        request = log.predict_log.request
        assert (request.model_spec.name, request.model_spec.signature_name) == ("ctr", "raw")
        assert sorted(request.inputs) == sorted(RAW_FIELDS)
        np.testing.assert_array_equal(tf.make_ndarray(request.inputs["I1"]), numeric[:batch, 0])
        assert [v.decode() for v in tf.make_ndarray(request.inputs["C3"])] == categorical[:batch, 2].tolist()
        tensors = {k: tf.constant(tf.make_ndarray(t)) for k, t in request.inputs.items()}
        assert signature(**tensors)["ctr"].shape == (batch, 1)
