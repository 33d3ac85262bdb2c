"""The load gate of the served raw path: a version loads only when the compiled FeatureSpec + the features model
reproduces the expected raw warm-up scores (or, with none recorded, the version's raw graph)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from ctr_features.compiled import few_rows as raw_one_row
from ctr_features.parity import build_raw_rows
from export.tf.warmup import write_warmup
from serving.errors import ModelLoadError
from serving.repository.warmup import warm_up
from serving.runtime.backends import load_backend
from serving.runtime.onnx_runtime import OnnxRuntimeBackend
from serving.runtime.spec_backend import SpecBackend, with_spec_transform
from tests.serving.codecs.test_unit_raw_fast import fit_spec
from tests.serving.model_repo import make_weights, reference_outputs, reference_predict, write_onnx
from tests.serving.raw_model_repo import raw_graph


def _version(tmp_path: Path, offset: float | None, calibrated: bool = False, shifted: str = "ctr") -> Path:
    """A version with model.onnx, model_raw.onnx and the spec; the raw warm-up record's `shifted` output moved by
    `offset` (None: raw records without scores, as exports before the load gate wrote them). `calibrated`: both
    graphs serve ctr and raw_score (tests/serving/model_repo.py), and the records carry both."""
    spec, weights = fit_spec(), make_weights(seed=11)
    version = tmp_path / "1"
    (version / "assets.extra").mkdir(parents=True)
    write_onnx(weights, version / "model.onnx", calibrated)
    onnx.save(raw_graph(onnx.load(str(version / "model.onnx")), spec), version / "model_raw.onnx")
    spec.save(version / "assets.extra" / "feature_spec.json")
    (numeric, categorical), _ = build_raw_rows(spec, 64, None)
    features = spec.transform(numeric, categorical)
    # FeatureSpec + the model
    expected = (
        reference_outputs(weights, features) if calibrated else {"ctr": reference_predict(weights, features)}
    )
    if offset is not None:
        expected[shifted] = expected[shifted] + offset
    write_warmup(
        version / "assets.extra" / "tf_serving_warmup_requests",
        features,
        "ctr",
        "features",
        "serving_default",
        (numeric, categorical),
        None if offset is None else expected,
    )
    return version


def test_a_version_whose_served_raw_path_reproduces_the_export_scores_loads(tmp_path: Path) -> None:
    version = _version(tmp_path, 0.0)
    backend = with_spec_transform(load_backend("onnx", version, 1), version)
    assert isinstance(backend, SpecBackend)
    assert warm_up(backend, version) == 6


def test_scores_that_disagree_with_the_recorded_ones_fail_the_load(tmp_path: Path) -> None:
    version = _version(tmp_path, 0.01)
    with pytest.raises(ModelLoadError) as caught:
        warm_up(with_spec_transform(load_backend("onnx", version, 1), version), version)
    assert str(caught.value).startswith(
        "raw warm-up record 0: the served raw path differs from the scores recorded at export "
        "(FeatureSpec.transform + PyTorch) by 0.01"
    )
    assert str(caught.value).endswith("(> 0.0001); re-export the version with this code")


def test_each_recorded_output_of_a_calibrated_version_is_gated(tmp_path: Path) -> None:
    loads = _version(tmp_path / "same", 0.0, calibrated=True)
    assert warm_up(with_spec_transform(load_backend("onnx", loads, 1), loads), loads) == 6
    version = _version(tmp_path / "moved", 0.01, calibrated=True, shifted="raw_score")
    with pytest.raises(ModelLoadError) as caught:
        warm_up(with_spec_transform(load_backend("onnx", version, 1), version), version)
    assert str(caught.value).startswith(
        "raw warm-up record 0: the served raw path's 'raw_score' differs from the scores recorded at export "
        "(FeatureSpec.transform + PyTorch) by 0.01"
    )


def test_without_recorded_scores_a_spec_that_is_not_the_graphs_fails_the_load(tmp_path: Path) -> None:
    version = _version(tmp_path, None)
    assert (
        warm_up(with_spec_transform(load_backend("onnx", version, 1), version), version) == 6
    )  # checked against model_raw.onnx
    path = version / "assets.extra" / "feature_spec.json"
    doc = json.loads(path.read_text())
    doc["numeric"]["mean"][0] += 1.0  # a spec file that no longer matches the graph exported with it
    path.write_text(json.dumps(doc))
    with pytest.raises(
        ModelLoadError,
        match=r"^raw warm-up record 0: the served raw path differs from the "
        r"version's raw graph by [0-9.e-]+ \(> 0.0001\); re-export the version with this code$",
    ):
        warm_up(with_spec_transform(load_backend("onnx", version, 1), version), version)


def test_without_raw_records_two_probe_rows_still_check_the_spec_against_the_graph(tmp_path: Path) -> None:
    version = _version(tmp_path, None)
    (version / "assets.extra" / "tf_serving_warmup_requests").unlink()
    path = version / "assets.extra" / "feature_spec.json"
    doc = json.loads(path.read_text())
    doc["numeric"]["std"] = [s * 2 for s in doc["numeric"]["std"]]
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelLoadError, match="the version's raw graph"):
        warm_up(with_spec_transform(load_backend("onnx", version, 1), version), version)


def test_a_version_without_a_spec_serves_raw_through_its_graph(tmp_path: Path) -> None:
    version = _version(tmp_path, 0.0)
    (version / "assets.extra" / "feature_spec.json").unlink()
    backend = with_spec_transform(load_backend("onnx", version, 1), version)
    assert isinstance(backend, OnnxRuntimeBackend) and backend.signature.has_raw
    assert warm_up(backend, version) == 6  # the graph against the recorded scores


def test_a_served_route_that_only_rest_bodies_take_is_gated_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records' rows also go as REST bodies through the server's decoder (the native scan) and the native
    few-row transform, which the tensor route never reaches: a fault there alone fails the load."""
    version = _version(tmp_path, 0.0)
    rows = raw_one_row._native_rows
    assert rows is not None

    def shifted(*args: Any) -> Any:
        found = rows(*args)
        if found is not None:
            features = np.frombuffer(found[0], np.float32).copy()
            features[:13] += 0.5  # the first row's z-scores
            found = (bytearray(features.tobytes()), found[1])
        return found

    monkeypatch.setattr(raw_one_row, "_native_rows", shifted)
    with pytest.raises(ModelLoadError) as caught:
        warm_up(with_spec_transform(load_backend("onnx", version, 1), version), version)
    assert str(caught.value).startswith(
        "raw warm-up record 0 sent as a REST body: the served raw path differs from the scores recorded at export"
    )
