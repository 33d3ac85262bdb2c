"""The orchestrator: failures and time bounds become report entries and exit codes, never a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.harness import suite
from bench.harness.modes import BenchMode
from bench.harness.procs import StepError
from bench.harness.suite import exit_code, run_bench
from tests.bench.mdtables import read_sections
from tests.helpers import REPO_ROOT


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (our tmp_path: only our children)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def test_exit_code_says_how_many_sections_were_measured() -> None:
    ok, failed = {"status": "ok"}, {"status": "failed"}

    assert exit_code({"training": ok, "serving": ok}, interrupted=False) == 0
    assert exit_code({"training": ok, "serving": failed}, interrupted=False) == 1
    assert exit_code({"training": failed, "serving": failed}, interrupted=False) == 2
    assert exit_code({"training": ok}, interrupted=True) == 130


def test_section_past_its_time_bound_is_killed_and_reported(tmp_path: Path) -> None:
    mode = BenchMode(
        name="tiny", rows=10, train_args=(), step_timeout_s=5, section_timeout_s={"training": 0.01}
    )

    results = run_bench(mode, tmp_path, ["training"])

    training = results["sections"]["training"]
    assert training["status"] == "failed"
    assert training["reason"].startswith("timed out after 0 s")
    assert results["exit_code"] == 2
    assert json.loads((tmp_path / "results.json").read_text())["sections"]["training"]["status"] == "failed"
    assert "**FAILED**" in "\n".join(
        read_sections((tmp_path / "report.md").read_text())["1. Training throughput"]
    )
    assert not (tmp_path / "work").exists()
    assert processes_mentioning(str(tmp_path)) == []


def test_failed_pipeline_fails_the_sections_that_need_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_pipeline(*args: object) -> None:
        raise StepError("exit code 1: python -m export --run r --repo m\nunsupported op Erf in node /Erf")

    monkeypatch.setattr(suite, "build_inputs", broken_pipeline)
    mode = BenchMode(
        name="tiny",
        rows=10,
        train_args=(),
        step_timeout_s=5,
        section_timeout_s={"inference": 5, "serving": 5},
    )

    results = run_bench(mode, tmp_path, ["inference", "serving"])

    assert results["pipeline"]["status"] == "failed"
    for name in ("inference", "serving"):
        assert results["sections"][name]["status"] == "failed"
        assert results["sections"][name]["reason"].splitlines()[-1] == "unsupported op Erf in node /Erf"
    assert results["exit_code"] == 2
    report = read_sections((tmp_path / "report.md").read_text())
    assert "unsupported op Erf in node /Erf" in report["Inputs (data → train → export)"]
    assert "unsupported op Erf in node /Erf" in report["3. End-to-end serving"]


def test_ctrl_c_stops_every_child_and_still_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "--mode", "tiny", "--sections", "training", "--out", str(out)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # Ctrl-C's default action even when this suite runs as a background job (`cmd &` without job
        # control starts it with SIGINT ignored, and Python keeps an inherited SIG_IGN).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Wait for a grandchild (the section's own worker process, in its own session) besides the section
    # runner: the interrupt must reach processes two levels down.
    deadline = time.monotonic() + 180  # data generation and features first; slow on a loaded machine
    while len(set(processes_mentioning(str(out))) - {bench.pid}) < 2:
        assert time.monotonic() < deadline, "the training section never started a worker"
        assert bench.poll() is None, bench.communicate()[0].decode()
        time.sleep(0.1)

    bench.send_signal(signal.SIGINT)
    output = bench.communicate(timeout=60)[0].decode()

    assert bench.returncode == 130, output
    assert "[bench] interrupted: stopping every child process" in output
    results = json.loads((out / "results.json").read_text())
    assert results["sections"]["training"]["status"] == "interrupted"
    assert results["exit_code"] == 130
    assert (out / "report.md").is_file()
    assert processes_mentioning(str(out)) == []
