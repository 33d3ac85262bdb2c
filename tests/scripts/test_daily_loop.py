"""The daily loop against a live server: days 0 -> 1 -> 2 through scripts/daily.sh (small data), then a bad
candidate that the quality gate refuses. Each day's version must be served, and no predict may fail.

The full loop trains and exports three times (minutes: marked slow). The fast variant publishes versions
the way export does (an atomic rename of a complete folder) under the same traffic, and has the gate refuse a
bad candidate through `python -m export`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.export.export_runs import make_run
from tests.export.gates.test_export_gate import mlp_weights, negate_output, publish_by_hand
from tests.helpers import REPO_ROOT
from tests.serving.model_repo import reference_predict
from tests.serving.server_process import ServerProcess, http, wait_polls

pytestmark = pytest.mark.slow  # make test-slow: the daily loop end to end

ROWS = 12_000  # per day: ~1,100 validation rows, for the calibrator's fit (at least 1,000) and the gate
# Small data makes the gate's figures noisy; the refused candidate below misses by far more than these.
LOOSE_GATE = "--max-auc-drop 0.05 --max-ece-rise 0.05 --max-calibration-gap 0.1"


class Traffic:
    """Predicts in a loop on a background thread; records every answer after the first success."""

    def __init__(self, server: ServerProcess) -> None:
        self.server, self.ok, self.failures = server, 0, []
        self.versions: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.body = {"instances": np.random.default_rng(0).normal(size=(4, 128)).round(3).tolist()}

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait_answers(self, n: int, timeout_s: float = 30) -> None:
        """Wait until `n` more predicts have been answered than when called."""
        target, deadline = self.ok + n, time.monotonic() + timeout_s
        while self.ok < target:
            assert time.monotonic() < deadline, (
                f"fewer than {n} answers in {timeout_s}s: {self.failures[-3:]}"
            )
            time.sleep(0.02)

    def _run(self) -> None:
        while not self._stop.is_set():
            status, body = http(self.server.url("/v1/models/ctr:predict"), self.body)
            if status == 200:
                self.ok += 1
            else:
                self.failures.append((status, body))
            time.sleep(0.02)


def served_version(server: ServerProcess) -> int | None:
    status, body = http(server.url("/v1/models/ctr"))
    if status != 200:
        return None
    return max(int(s["version"]) for s in body["model_version_status"] if s["state"] == "AVAILABLE")


def wait_for_version(server: ServerProcess, version: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while served_version(server) != version:
        assert time.monotonic() < deadline, f"version {version} not served:\n{server.log()[-3000:]}"
        time.sleep(0.2)


def day(n: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/daily.sh", str(n)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_days_0_1_2_are_served_in_turn_and_a_bad_candidate_is_refused(tmp_path: Path):
    repo, work = tmp_path / "models" / "ctr", tmp_path / "daily"
    repo.mkdir(parents=True)
    env = {
        **os.environ,
        "PY": sys.executable,
        "REPO": str(repo),
        "WORK": str(work),
        "ROWS": str(ROWS),
        "TRAIN_ARGS": "--batch-size 256 --patience 5",
        "EXPORT_ARGS": LOOSE_GATE,
    }
    server = ServerProcess(repo, tmp_path / "server.log", "--file_system_poll_wait_seconds=1")
    traffic = None
    try:
        for n in (0, 1, 2):
            proc = day(n, env)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            wait_for_version(server, n + 1)
            if traffic is None:
                traffic = Traffic(server).start()
            traffic.wait_answers(20)  # traffic on the new version before the next swap

        manifest = json.loads((repo / "2" / "assets.extra" / "manifest.json").read_text())
        assert manifest["quality_gate"]["served"]["version"] == 1
        assert manifest["quality_gate"]["passed"] is True
        assert manifest["training_metrics"]["config"]["init_from"] == str(repo / "1")
        assert (repo / "2" / "assets.extra" / "drift_reference.json").is_file()

        bad = negate_output(work / "runs" / "day2", tmp_path / "bad-run")
        proc = subprocess.run(
            [sys.executable, "-m", "export", "--run", str(bad), "--repo", str(repo)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        errors = [line for line in proc.stderr.splitlines() if line.startswith("export:")]
        assert proc.returncode == 1
        assert len(errors) == 1 and errors[0].startswith("export: error: quality gate refused the candidate")
        assert sorted(int(p.name) for p in repo.iterdir() if p.name.isdigit()) == [1, 2, 3]
        wait_polls(server, 2)  # a poll after the refusal: still version 3
        assert served_version(server) == 3
    finally:
        if traffic is not None:
            traffic.stop()
        server.stop()
    assert traffic is not None and traffic.ok > 20
    assert traffic.failures == []


def test_versions_swap_under_traffic_without_a_failed_request_and_a_bad_candidate_is_refused(tmp_path: Path):
    runs = {seed: make_run(tmp_path / f"run{seed}", seed=seed) for seed in (1, 2, 3)}
    x = np.load(runs[3] / "val_features.npy")
    p = reference_predict(mlp_weights(runs[3]), x).ravel()
    np.save(runs[3] / "val_labels.npy", (np.random.default_rng(0).random(len(p)) < p).astype(np.float32))
    repo = tmp_path / "models" / "ctr"
    publish_by_hand(repo, 1, runs[1])
    server = ServerProcess(repo, tmp_path / "server.log", "--file_system_poll_wait_seconds=1")
    try:
        server.wait_ready()
        traffic = Traffic(server).start()
        for version in (2, 3):
            publish_by_hand(repo, version, runs[version])
            wait_for_version(server, version)
            traffic.wait_answers(10)  # traffic on the new version before the next swap
        bad = negate_output(runs[3], tmp_path / "bad")
        proc = subprocess.run(
            [sys.executable, "-m", "export", "--run", str(bad), "--repo", str(repo)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1].startswith("export: error: quality gate refused the candidate")
        assert served_version(server) == 3
        traffic.stop()
    finally:
        server.stop()
    assert traffic.ok > 20 and traffic.failures == []
