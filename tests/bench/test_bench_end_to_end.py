"""`python -m bench --mode tiny`: the real pipeline and all three sections, report, plots and compare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report.measurements import flatten
from tests.bench.mdtables import read_sections, read_tables
from tests.helpers import REPO_ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(1260)
def test_tiny_bench_measures_every_section_and_writes_report_plots_and_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--mode", "tiny", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )

    results = json.loads((out / "results.json").read_text())
    failures = {k: v.get("reason") for k, v in results["sections"].items() if v["status"] != "ok"}
    assert failures == {}, proc.stdout + proc.stderr
    assert proc.returncode == 0
    assert results["pipeline"]["status"] == "ok"
    assert results["machine"]["packages"]["torch"].startswith("2.13.0")
    report = read_sections((out / "report.md").read_text())
    for heading in ("1. Training throughput", "2. Inference latency (in-process)", "3. End-to-end serving"):
        rows = read_tables(report[heading])[0]  # the section's main table; DDP, RSS tables follow it
        assert len(rows) == len(results["sections"][_key(heading)]["rows"])
    for png in ("training_throughput.png", "inference_latency.png", "latency_vs_load.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) > 10_000
    assert not (out / "work").exists()

    # Run B: the same figures, except that every serving QPS doubled and every inference p99 doubled.
    run_b = json.loads((out / "results.json").read_text())
    for section, field in (("serving", "qps"), ("inference", "p99_ms")):
        for row in run_b["sections"][section]["rows"]:
            if isinstance(row.get(field), int | float):
                row[field] *= 2
    (tmp_path / "b.json").write_text(json.dumps(run_b))
    compare = subprocess.run(
        [sys.executable, "-m", "bench.compare", str(out), str(tmp_path / "b.json")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert compare.returncode == 0, compare.stderr
    names = flatten(results)
    lines = compare.stdout.splitlines()
    verdicts = {name: [line for line in lines if line.startswith(name + "  ")] for name in names}

    def expected(name: str) -> list[str]:
        if name.startswith("serving/") and name.endswith("/qps"):
            return ["2.000", "better"]
        if name.startswith("inference/") and name.endswith("/p99_ms"):
            return ["2.000", "worse"]
        return ["1.000", "same"]

    assert names and {name: line.split()[-2:] for name, [line] in verdicts.items()} == {
        name: expected(name) for name in names
    }


def _key(heading: str) -> str:
    return {"1": "training", "2": "inference", "3": "serving"}[heading.split(".")[0]]
