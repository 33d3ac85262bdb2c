"""The PNG plots on a synthetic results dict: one non-empty PNG per measured section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report.plots import write_plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_every_measured_section_gets_a_non_empty_png(results: dict[str, Any], tmp_path: Path) -> None:
    written = write_plots(results, tmp_path)

    assert written == {"training_throughput.png", "inference_latency.png", "latency_vs_load.png"}
    for name in written:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 10_000, f"{name} is only {len(data)} bytes"


def test_failed_section_gets_no_plot(results: dict[str, Any], tmp_path: Path) -> None:
    results["sections"]["inference"] = {"status": "failed", "reason": "onnxruntime missing", "seconds": 1.0}

    written = write_plots(results, tmp_path)

    assert written == {"training_throughput.png", "latency_vs_load.png"}
    assert not (tmp_path / "inference_latency.png").exists()
