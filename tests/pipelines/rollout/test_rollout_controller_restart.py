"""The rollout controller killed (SIGKILL) at each point of a decision: after a restart, none lost or repeated.

Each run is a real `python -m pipelines.rollout --once` process; `CTR_ROLLOUT_KILL_AT=journal:N` (or
`config:N`) makes it SIGKILL itself right after decision N's journal line (or its config write). The restarted
controller must finish that decision and end with the same journal, config file and state as a run never
killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipelines.rollout.config_file import Target, render
from tests.helpers import REPO_ROOT, free_port
from tests.pipelines.rollout_env import add_version, decisions, fig, write_config, write_snapshot

EXPECTED = [("adopt", 1), ("load", 2), ("shadow", 2), ("canary", 2), ("promote", 2)]


def _world(root: Path) -> Path:
    """Versions 1 and 2, a config labelling 1 stable, and a snapshot in which 2 passes shadow and canary."""
    base = root / "models" / "ctr"
    base.mkdir(parents=True)
    add_version(base, 1)
    add_version(base, 2)
    write_config(root / "models.config", base, 'version_labels { key: "stable" value: 1 } ')
    write_snapshot(root / "live", 7, fig(1, "stable", 0.75), fig(2, "shadow", 0.76), fig(2, "canary", 0.76))
    return root


def _run(root: Path, kill_at: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "CTR_ROLLOUT_KILL_AT"}
    if kill_at:
        env["CTR_ROLLOUT_KILL_AT"] = kill_at
    args = [
        "--model-config",
        root / "models.config",
        "--eval-state",
        root / "live",
        "--state-dir",
        root / "rollout",
    ]
    cmd = [sys.executable, "-m", "pipelines.rollout", *map(str, args), "--server", "none", "--once"]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, timeout=60).returncode


def _outcome(root: Path) -> tuple[list[tuple[str, int, int]], str, dict[str, object]]:
    journal = [(d["action"], d["version"], d["seq"]) for d in decisions(root / "rollout")]
    state = json.loads((root / "rollout" / "state.json").read_text())
    state.pop("step_since")
    return journal, (root / "models.config").read_text().replace(str(root), "ROOT"), state


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[object, ...]]:
    root = _world(tmp_path_factory.mktemp("reference"))
    assert _run(root) == 0
    outcome = _outcome(root)
    assert [(a, v) for a, v, _ in outcome[0]] == EXPECTED
    return root, outcome


@pytest.mark.parametrize("kill_at", ["journal:1", "config:2", "journal:3", "config:4", "journal:5"])
def test_a_kill_at_any_point_loses_and_repeats_nothing(
    tmp_path: Path, kill_at: str, reference: tuple[Path, tuple[object, ...]]
) -> None:
    root = _world(tmp_path)
    point, n = kill_at.split(":")
    assert _run(root, kill_at) == -signal.SIGKILL
    journal = decisions(root / "rollout")
    assert [d["seq"] for d in journal] == list(range(1, int(n) + 1))  # decision n is made: journalled
    saved = root / "rollout" / "state.json"
    assert (json.loads(saved.read_text())["seq"] if saved.exists() else 0) == int(n) - 1  # not yet finished
    text = (root / "models.config").read_text()
    says_target = render(text, "ctr", Target.from_dict(journal[-1]["target"])) == text
    assert says_target == (point == "config")  # killed before, or after, the config write
    assert _run(root) == 0
    assert _outcome(root) == reference[1]


def test_a_torn_journal_line_was_never_a_decision(
    tmp_path: Path, reference: tuple[Path, tuple[object, ...]]
) -> None:
    root = _world(tmp_path)
    assert _run(root, "config:2") == -signal.SIGKILL
    shutil.copy(root / "rollout" / "decisions.jsonl", tmp_path / "two-lines")
    with (root / "rollout" / "decisions.jsonl").open("a") as f:
        f.write('{"seq": 3, "action": "shad')  # a kill in the middle of appending decision 3
    assert _run(root) == 0
    assert _outcome(root) == reference[1]
    assert (root / "rollout" / "decisions.jsonl").read_text().startswith((tmp_path / "two-lines").read_text())


def test_the_long_running_controller_serves_its_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    root, port = _world(tmp_path), free_port()
    args = [
        "--model-config",
        root / "models.config",
        "--eval-state",
        root / "live",
        "--state-dir",
        root / "rollout",
    ]
    cmd = [
        sys.executable,
        "-m",
        "pipelines.rollout",
        *map(str, args),
        "--server",
        "none",
        "--interval-s",
        "0.2",
    ]
    proc = subprocess.Popen(
        [*cmd, "--metrics-port", str(port)], cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline, text = time.monotonic() + 30, ""
        while 'ctr_rollout_stable_version{model="ctr"} 2.0' not in text:
            assert time.monotonic() < deadline and proc.poll() is None, text
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                continue
        for action, n in (
            ("adopt", 1),
            ("load", 1),
            ("shadow", 1),
            ("canary", 1),
            ("promote", 1),
            ("rollback", 0),
        ):
            assert f'ctr_rollout_decisions_total{{action="{action}",model="ctr"}} {n}.0' in text
        assert 'ctr_rollout_canary_percent{model="ctr"} 0.0' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert "decision 5: promote version 2" in err
