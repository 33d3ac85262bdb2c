"""`python -m bench --mode tiny`: the real pipeline and all three sections, report, plots and compare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mdtables import read_sections, read_tables

from bench.figures import flatten

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_bench_measures_every_section_and_writes_report_plots_and_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--mode", "tiny", "--out", str(out)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )

    results = json.loads((out / "results.json").read_text())
    failures = {k: v.get("reason") for k, v in results["sections"].items() if v["status"] != "ok"}
    assert failures == {}, proc.stdout + proc.stderr
    assert proc.returncode == 0
    assert results["pipeline"]["status"] == "ok"
    assert results["machine"]["packages"]["torch"].startswith("2.13.0")
    report = read_sections((out / "report.md").read_text())
    for heading in ("1. Training throughput", "2. Inference latency (in-process)", "3. End-to-end serving"):
        [rows] = read_tables(report[heading])
        assert len(rows) == len(results["sections"][_key(heading)]["rows"])
    for png in ("training_throughput.png", "inference_latency.png", "latency_vs_load.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) > 10_000
    assert not (out / "work").exists()

    compare = subprocess.run(
        [sys.executable, "-m", "bench.compare", str(out), str(out)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert compare.returncode == 0, compare.stderr
    verdicts = [line.split()[-2:] for line in compare.stdout.splitlines() if line.split()[-1:] == ["same"]]
    assert len(verdicts) == len(flatten(results)) > 0
    assert all(v == ["1.000", "same"] for v in verdicts)


def _key(heading: str) -> str:
    return {"1": "training", "2": "inference", "3": "serving"}[heading.split(".")[0]]
