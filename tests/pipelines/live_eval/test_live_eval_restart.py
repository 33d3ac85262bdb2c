"""Killing the live evaluation at any point: after a restart, every interval is evaluated exactly once (one
history line each, the click counts not repeated) and the figures equal those of a run never killed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.live_eval.service import LiveEval, Settings
from tests.helpers import REPO_ROOT
from tests.pipelines.live_world import Version, write_world

pytestmark = pytest.mark.slow  # make test-slow: kills and restarts the evaluator

T0 = 1_700_000_000.0
S, SECONDS = 10.0, 600.0
FIRST = int(T0 // S)
VERSIONS = [Version(1, "stable", 90.0), Version(2, "canary", 10.0, noise=1.0, canary=True)]


def _settings(world: Path, state: Path) -> Settings:
    return Settings(world / "logs", world / "clicks", state, S, 30.0, 5.0, min_rows=50)


def _history(state: Path) -> list[dict]:
    path = state / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _command(world: Path, state: Path) -> list[str]:
    flags = {
        "--logs": world / "logs",
        "--clicks": world / "clicks",
        "--state-dir": state,
        "--interval-s": 10,
        "--window-s": 30,
        "--attribution-window-s": 5,
        "--min-rows": 50,
        "--metrics-port": 0,
        "--start": T0,
        "--until": T0 + SECONDS,
    }
    return [sys.executable, "-m", "pipelines.live_eval", *(str(x) for kv in flags.items() for x in kv)]


def _kill_after(world: Path, state: Path, lines: int) -> int:
    """Start the evaluator, SIGKILL it once history.jsonl has `lines` lines; returns the lines it had then."""
    proc = subprocess.Popen(
        _command(world, state), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            path = state / "history.jsonl"
            if path.exists() and path.read_bytes().count(b"\n") >= lines:
                break
            time.sleep(0.002)
        assert proc.poll() is None, f"the evaluator finished before the kill: {proc.stdout.read()!r}"  # type: ignore[union-attr]
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(10)
    return len(_history(state))


def test_a_killed_evaluator_restarts_without_losing_or_repeating_an_interval(tmp_path: Path):
    world = tmp_path / "world"
    write_world(world, T0, SECONDS, 20, VERSIONS)
    reference = LiveEval(_settings(world, tmp_path / "reference"), first=FIRST)
    reference.run(until=T0 + SECONDS)
    state = tmp_path / "state"
    first_kill = _kill_after(world, state, 3)
    seen = [first_kill, _kill_after(world, state, first_kill + 10)]
    assert 3 <= seen[0] < seen[1] < SECONDS / S  # each kill landed mid-run
    done = subprocess.run(_command(world, state), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    history, want = _history(state), _history(tmp_path / "reference")
    assert [h["interval"] for h in history] == list(range(FIRST, FIRST + int(SECONDS / S)))
    assert history == want  # the same figures, counts and pending rows as the run never killed
    got_state = json.loads((state / "state.json").read_text())
    assert got_state["counts"] == reference.state.counts and got_state["next"] == FIRST + 60
    assert json.loads((state / "snapshot.json").read_text()) == want[-1]


def test_a_kill_between_the_history_line_and_the_state_writes_the_line_once(tmp_path: Path):
    world, state = tmp_path / "world", tmp_path / "state"
    write_world(world, T0, 60, 50, VERSIONS)
    LiveEval(_settings(world, state), first=FIRST).run(intervals=2)
    before = (state / "state.json").read_bytes()
    LiveEval(_settings(world, state)).run(intervals=1)
    # the kill: interval 3's partitions, snapshot and history line were written, its state was not
    (state / "state.json").write_bytes(before)
    assert len(_history(state)) == 3
    restarted = LiveEval(_settings(world, state))
    assert len(_history(state)) == 2  # the unrecorded line is cut on start
    restarted.run(until=T0 + 60)
    history = _history(state)
    assert [h["interval"] for h in history] == list(range(FIRST, FIRST + 6))
    reference = LiveEval(_settings(world, tmp_path / "reference"), first=FIRST)
    reference.run(until=T0 + 60)
    assert history == _history(tmp_path / "reference") and restarted.state.counts == reference.state.counts
