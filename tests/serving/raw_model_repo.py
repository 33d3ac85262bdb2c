"""A version folder with both signatures in ONNX (model.onnx + model_raw.onnx), without TensorFlow: quick to build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from ctr_features.compiled.onnx_graph import build_raw_model
from ctr_features.spec import FeatureSpec
from tests.serving.model_repo import OUTPUTS, make_weights, write_manifest, write_onnx, write_warmup
from training.synth import sample_rows


def fit_spec(seed: int = 3, n: int = 3_000) -> FeatureSpec:
    """A FeatureSpec fitted on synthetic rows (values C1 saw are `spec.tables[0].vocab`)."""
    rng = np.random.default_rng(seed)
    numeric, ranks = sample_rows(rng, n)
    categorical = np.char.mod("%08x", ranks % 40).astype(object)
    categorical[ranks < 0] = ""
    labels = (rng.random(n) < 0.25 + 0.3 * (ranks[:, 8] == 0)).astype(np.float32)
    return FeatureSpec.fit(numeric, categorical, labels, min_count=20)


def seen_values(spec: FeatureSpec, n: int = 2) -> list[str]:
    """The first `n` values of C1 that the spec saw in training (they map to their own embedding rows)."""
    return [v.decode() for v in spec.tables[0].vocab[:n]]


def raw_graph(model: onnx.ModelProto, spec: FeatureSpec) -> onnx.ModelProto:
    """model_raw.onnx of a features model with one output or with `ctr` and `raw_score`: the FeatureSpec nodes,
    then every node of `model`, with `model`'s outputs."""
    outputs = list(model.graph.output)
    single = onnx.ModelProto()
    single.CopyFrom(model)
    del single.graph.output[1:]  # composed on `ctr` alone: the raw_score node stays in the graph
    raw = build_raw_model(single, spec)
    raw.graph.output.extend(outputs[1:])
    onnx.checker.check_model(raw, full_check=True)
    return raw


def write_raw_version(
    base: Path, version: int, spec: FeatureSpec, seed: int = 11, calibrated: bool = False
) -> Path:
    """`<base>/<version>/` serving `serving_default` and `raw` from ONNX, renamed into place like export does;
    `calibrated`: both graphs serve `ctr` and `raw_score` (tests/serving/model_repo.py), listed in the manifest."""
    stage = base / f".tmp-{version}"
    stage.mkdir(parents=True)
    write_onnx(make_weights(seed=seed), stage / "model.onnx", calibrated)
    proto = onnx.load(str(stage / "model.onnx"))
    onnx.save(raw_graph(proto, spec), stage / "model_raw.onnx")
    (stage / "assets.extra").mkdir(exist_ok=True)
    spec.save(stage / "assets.extra" / "feature_spec.json")
    write_warmup(stage / "assets.extra" / "tf_serving_warmup_requests", [np.zeros((1, 128), np.float32)])
    write_manifest(stage, version, OUTPUTS if calibrated else None, raw=True)
    final = base / str(version)
    stage.rename(final)
    return final


def write_both_kinds(base: Path, spec: FeatureSpec, seed: int = 11) -> None:
    """Version 1 as exported before calibration (`ctr` alone, no `io` in its manifest) and version 2 with
    `ctr` and `raw_score`, from the same weights: version 2's raw_score is version 1's ctr."""
    write_raw_version(base, 1, spec, seed)
    write_raw_version(base, 2, spec, seed, calibrated=True)
