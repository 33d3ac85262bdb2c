"""bench/sections/inference_latency.py on a published version: every backend, every batch size."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.sections.inference_latency import BATCHES, RAW_BATCHES, run
from ctr_contract import BEST_CHECKPOINT
from tests.conftest import Published


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_latency_rows_cover_every_backend_and_batch(published: Callable[..., Published]) -> None:
    p = published("relu")
    result = run("tiny", p.version_dir, p.run / BEST_CHECKPOINT)
    backends = ["PyTorch eager", "TorchScript", "ONNX Runtime", "TF SavedModel"]
    # the `raw` signature: Criteo fields in (the graphs, and the FeatureSpec our server runs before model.onnx)
    raw = ["ONNX Runtime (raw)", "TF SavedModel (raw)", "ONNX Runtime (raw, our server's FeatureSpec)"]
    assert [(r["backend"], r["batch"]) for r in result["rows"]] == [
        *[(b, n) for b in backends for n in BATCHES],
        *[(b, n) for b in raw for n in RAW_BATCHES],
    ]
    for r in result["rows"]:
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["runs"] == len(r["p50_ms_runs"]) == len(r["p99_ms_runs"]) == 2
    assert result["commands"] == [
        f"python -m bench.sections.inference_latency --mode tiny --version-dir {p.version_dir} "
        f"--checkpoint {p.run / BEST_CHECKPOINT}"
    ]
