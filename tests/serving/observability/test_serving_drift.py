"""Drift metrics on a live server: PSI of each model-input feature and of the score against the reference.

The version is a small ONNX MLP whose FeatureSpec is fitted on day 0 of the synthetic world, with the drift
reference export writes (export/publish/drift_reference.py) from 5,000 day-0 training rows. Traffic is other day-0 rows
(no drift) and day-5 rows (I3, I5 and I7 have moved by 0.6 of their spread: training/truth.py).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest

from ctr_contract.repository import DRIFT_REFERENCE_PATH, FEATURE_SPEC_PATH, RAW_ONNX_MODEL
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.onnx_graph import build_raw_model
from ctr_features.spec import FeatureSpec
from export.publish.drift_reference import build_reference, raw_bins
from tests.serving.model_repo import make_weights, reference_predict, write_manifest, write_onnx
from tests.serving.server_process import ServerProcess, http
from training.synth import hex_values, sample_rows

TRAIN_ROWS, LIVE_ROWS, WINDOW = 5_000, 2_000, 2_000
DRIFTED = ("I3", "I5", "I7")
SAMPLE = re.compile(r'^(ctr_serving_\w+)\{model_name="ctr"(?:,feature="([\w:]+)")?\} (\S+)$')


def raw_rows(day: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Day `day` of the synthetic world: counts float [n, 13] and categorical strings [n, 26] ("" = missing)."""
    counts, ids = sample_rows(np.random.default_rng([seed, day]), n, day)
    cats = np.stack([np.asarray(hex_values(j, ids[:, j]).to_pylist(), object) for j in range(26)], 1)
    return counts, np.where(cats == None, "", cats)  # noqa: E711 (elementwise comparison)


@pytest.fixture(scope="module")
def drift_world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FeatureSpec, list[np.ndarray]]:
    """A model base path with version 1 (spec and drift reference from day 0); returns (base, spec, weights)."""
    counts, cats = raw_rows(0, TRAIN_ROWS, seed=1)
    labels = (np.random.default_rng(0).random(TRAIN_ROWS) < 0.25).astype(np.float64)
    spec = FeatureSpec.fit(counts, cats, labels)
    train_x = spec.transform(counts, cats)
    weights = make_weights(seed=1)
    base = tmp_path_factory.mktemp("drift") / "ctr"
    stage = base / ".tmp-1"
    (stage / "assets.extra").mkdir(parents=True)
    write_onnx(weights, stage / "model.onnx")
    onnx.save(build_raw_model(onnx.load(stage / "model.onnx"), spec), stage / RAW_ONNX_MODEL)
    spec.save(stage / FEATURE_SPEC_PATH)
    val_x = train_x[-1000:]
    doc = build_reference(
        train_x[:-1000], reference_predict(weights, val_x), {"features": "test", "scores": "test"}
    )
    doc["raw"] = raw_bins(counts[-1000:], cats[-1000:])  # export takes the run's raw validation rows
    (stage / DRIFT_REFERENCE_PATH).write_text(json.dumps(doc))
    write_manifest(stage, 1)
    stage.rename(base / "1")
    return base, spec, weights


def raw_instances(counts: np.ndarray, cats: np.ndarray) -> list[dict]:
    """Raw request rows: {"I1": 3, ..., "C1": "68fd1e64", ...}, missing fields left out."""
    rows = []
    for num, cat in zip(counts, cats, strict=True):
        row = {f: int(v) for f, v in zip(NUMERIC_FIELDS, num, strict=True) if not np.isnan(v)}
        rows.append(row | {f: v for f, v in zip(CATEGORICAL_FIELDS, cat, strict=True) if v})
    return rows


def send(server: ServerProcess, features: np.ndarray | list, batch: int = 100) -> set[str]:
    """POST the rows (feature vectors or raw rows) in batches; returns the pids (x-served-by-pid) that answered."""
    pids = set()
    for start in range(0, len(features), batch):
        rows = features[start : start + batch]
        body = json.dumps({"instances": rows.tolist() if isinstance(rows, np.ndarray) else rows}).encode()
        request = urllib.request.Request(server.url("/v1/models/ctr:predict"), data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            pids.add(response.headers.get("x-served-by-pid"))
    return pids


def drift_metrics(server: ServerProcess) -> tuple[dict[str, float], float | None, float]:
    """(feature -> PSI, score PSI or None, window rows) from one scrape."""
    status, text = http(server.url("/monitoring/prometheus/metrics"))
    assert status == 200
    features, score, window = {}, None, -1.0
    for line in str(text).splitlines():
        m = SAMPLE.match(line)
        if m is None:
            continue
        name, feature, value = m.group(1), m.group(2), float(m.group(3))
        if name == "ctr_serving_feature_drift_psi":
            features[feature] = value
        elif name == "ctr_serving_score_drift_psi":
            score = value
        elif name == "ctr_serving_drift_window_rows":
            window = value
    return features, score, window


def test_day0_traffic_stays_under_0_1_and_day5_traffic_pushes_drifted_features_over_0_2(
    drift_world, start_server
):
    base, spec, _ = drift_world
    server = start_server(base, f"--drift_window={WINDOW}")
    assert drift_metrics(server) == ({}, None, 0.0)  # nothing scored yet: no PSI series

    send(server, spec.transform(*raw_rows(0, LIVE_ROWS, seed=2)))
    features, score, window = drift_metrics(server)
    assert window == WINDOW
    assert len(features) == 128 and {"I1", "I13_missing", "C26_rate", "hash_75"} <= set(features)
    assert max(features.values()) < 0.1, sorted(features.items(), key=lambda kv: -kv[1])[:5]
    assert score is not None and score < 0.1

    send(server, spec.transform(*raw_rows(5, LIVE_ROWS, seed=2)))  # replaces the whole window
    features, score, window = drift_metrics(server)
    assert window == WINDOW
    assert all(features[f] > 0.2 for f in DRIFTED), {f: features[f] for f in DRIFTED}
    undrifted = [f"I{i}" for i in range(1, 14) if f"I{i}" not in DRIFTED]
    assert max(features[f] for f in undrifted) < 0.1


def test_drift_window_covers_every_worker(drift_world, start_server):
    base, spec, _ = drift_world
    server = start_server(base, f"--drift_window={WINDOW}", "--num_workers=2")
    # A worker listens once its model is loaded: under load the second may still be loading when the first
    # answers, and every connection would then go to the first. Wait until both answer.
    listening: set[str] = set()
    deadline = time.monotonic() + 60
    while len(listening) < 2:
        assert time.monotonic() < deadline, f"the second worker never listened:\n{server.log()}"
        with urllib.request.urlopen(server.url("/v1/models/ctr"), timeout=10) as response:
            listening.add(response.headers.get("x-served-by-pid"))
    rows = spec.transform(*raw_rows(5, 600, seed=3))
    pids = send(server, rows, batch=30)  # 20 connections: the kernel spreads them over both workers
    assert len(pids) == 2
    deadline = time.monotonic() + 20  # each worker copies its last rows into its shared ring buffer
    while drift_metrics(server)[2] != 600:  # within FLUSH_S: wait for both workers' rows
        assert time.monotonic() < deadline, f"the window never held both workers' rows:\n{server.log()}"
        time.sleep(0.05)
    for _ in range(6):  # each scrape is a new connection, answered by either worker
        features, score, window = drift_metrics(server)
        assert window == 600  # 1,000 rows of capacity per worker: nothing was overwritten
        assert all(features[f] > 0.2 for f in DRIFTED) and score is not None


def test_drift_window_0_turns_the_gauges_off(drift_world, start_server):
    base, spec, _ = drift_world
    server = start_server(base, "--drift_window=0")
    send(server, spec.transform(*raw_rows(0, 200, seed=4)))
    _, text = http(server.url("/metrics"))
    assert "drift" not in str(text)


def test_raw_requests_get_raw_field_psi_and_drifted_fields_cross_0_2(drift_world, start_server):
    base, _, _ = drift_world
    server = start_server(base, f"--drift_window={WINDOW}")
    send(server, raw_instances(*raw_rows(0, LIVE_ROWS, seed=2)))
    features, score, window = drift_metrics(server)
    assert window == WINDOW
    assert set(features) == {f"raw:{f}" for f in (*NUMERIC_FIELDS, *CATEGORICAL_FIELDS)}  # 39 series
    assert max(features.values()) < 0.1, sorted(features.items(), key=lambda kv: -kv[1])[:5]
    assert score is not None and score < 0.1

    send(server, raw_instances(*raw_rows(5, LIVE_ROWS, seed=2)))
    features, _, _ = drift_metrics(server)
    drifted = {f"raw:{f}" for f in (*DRIFTED, "C3", "C4", "C10", "C12", "C16", "C21", "C24")}
    assert all(features[f] > 0.2 for f in drifted), {f: features[f] for f in drifted}
    assert (
        max(v for f, v in features.items() if f not in drifted and f not in {"raw:C2", "raw:C7", "raw:C26"})
        < 0.1
    )


def test_a_version_without_a_reference_is_named_once_and_has_no_drift_samples(
    drift_world, start_server, tmp_path: Path
):
    """A hand-made version (or one exported before every export wrote the reference): one warning at load,
    and no sample of any drift gauge, the window's row count included, however much traffic comes."""
    base, spec, _ = drift_world
    bare = tmp_path / "ctr"
    shutil.copytree(base / "1", bare / "1")
    (bare / "1" / DRIFT_REFERENCE_PATH).unlink()
    write_manifest(bare / "1", 1)  # a manifest that does not list it: the version loads
    server = start_server(bare, f"--drift_window={WINDOW}")
    warning = f"{bare / '1'} has no {DRIFT_REFERENCE_PATH}; no drift metrics for this version"
    deadline = time.monotonic() + 10
    while warning not in server.log() and time.monotonic() < deadline:  # at load: before any request
        time.sleep(0.1)
    assert warning in server.log()

    send(server, spec.transform(*raw_rows(5, 600, seed=5)))
    send(server, raw_instances(*raw_rows(5, 300, seed=6)))
    for _ in range(3):
        status, text = http(server.url("/monitoring/prometheus/metrics"))
        assert status == 200
        samples = [line for line in str(text).splitlines() if "drift" in line and not line.startswith("#")]
        assert samples == []  # absent, not a window_rows that counts rows no PSI covers
    time.sleep(1.5)  # the reference is looked for again every second: still one warning
    assert server.log().count(warning) == 1
