"""The online trainer (`python -m pipelines.online`): SIGKILL and restart train every interval exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines.clicks.join import partition_name
from pipelines.demos.simulate import instances
from pipelines.online.__main__ import main, train_config
from pipelines.online.loop import Trainer
from pipelines.online.metrics import TrainerMetrics
from pipelines.online.state import State, load, save
from pipelines.online.step import Settings
from training.config import TrainConfig
from training.synth import make_world, sample_rows

REPO_ROOT = Path(__file__).resolve().parents[3]
INTERVAL_S, WINDOW_S = 20.0, 5.0


def _traffic(root: Path, first: int, intervals: dict[int, int]) -> None:
    """Request logs and clicks in the past: `intervals` maps an interval index to its request count (4 rows each)."""
    rng, world = np.random.default_rng(3), make_world(0, 20_000)
    (root / "logs").mkdir(parents=True)
    (root / "clicks").mkdir()
    with (
        (root / "logs" / "requests-1-1.jsonl").open("w") as log,
        (root / "clicks" / "c-1.jsonl").open("w") as clicks,
    ):
        for j, n in sorted(intervals.items()):
            for k in range(n):
                t = (first + j) * INTERVAL_S + k * INTERVAL_S / (n + 1)
                counts, ids = sample_rows(rng, 4, 0)
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
                rid = f"r{j}-{k}"
                log.write(
                    json.dumps(
                        {"request_id": rid, "time": stamp, "inputs": {"instances": instances(counts, ids)}}
                    )
                    + "\n"
                )
                p = 1 / (1 + np.exp(-world.logit(counts, ids)))
                for i in np.flatnonzero(rng.random(4) < p):
                    clicks.write(json.dumps({"request_id": rid, "instance": int(i), "time": t + 1.0}) + "\n")


def _trainer(root: Path, first: int, last: int) -> subprocess.Popen:
    args = [
        "--logs",
        root / "logs",
        "--clicks",
        root / "clicks",
        "--repo",
        root / "repo",
        "--work",
        root / "work",
        "--interval-s",
        INTERVAL_S,
        "--window-s",
        WINDOW_S,
        "--start",
        first * INTERVAL_S,
        "--until",
        (last + 1) * INTERVAL_S - 1,
        "--train-args",
        "--batch-size 256 --val-fraction 0.2",
        # A few hundred rows an interval: fewer than a calibrator's fit needs, and a noisy calibration ratio.
        "--calibration",
        "none",
        "--max-calibration-gap",
        "0.99",
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.online", *map(str, args)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=(root / "trainer.log").open("a"),
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_sigkill_mid_interval_and_restart_trains_every_interval_exactly_once(tmp_path: Path):
    first = int(time.time() // INTERVAL_S) - 100  # long closed intervals: the trainer never waits
    _traffic(tmp_path, first, {1: 150, 2: 150})  # interval 0 has no requests
    proc = _trainer(tmp_path, first, first + 2)
    deadline = time.time() + 240
    while time.time() < deadline:  # kill once interval 1 is being trained or exported
        state = load(tmp_path / "work")
        if state is not None and state.pending is not None:
            break
        assert proc.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = load(tmp_path / "work")
    assert killed is not None and killed.pending == {"interval": first + 1, "version": 1}
    assert [o["interval"] for o in killed.outcomes] == [first]
    restarted = _trainer(tmp_path, first, first + 2)
    assert restarted.wait(timeout=300) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    state = load(tmp_path / "work")
    assert state is not None and state.pending is None and state.next == first + 3
    assert [(o["interval"], o["outcome"]) for o in state.outcomes] == [
        (first, "empty"),
        (first + 1, "published"),
        (first + 2, state.outcomes[2]["outcome"]),
    ]
    published = [o["version"] for o in state.outcomes if o["outcome"] == "published"]
    versions = sorted(int(p.name) for p in (tmp_path / "repo").iterdir() if p.name.isdigit())
    assert versions == published == list(range(1, len(published) + 1))
    log = (tmp_path / "trainer.log").read_text()
    assert log.count(f"interval {first}: no rows joined: nothing trained") == 1
    assert log.count(f"interval {first + 1}: published version 1") == 1
    # Export scored the interval's held-out Parquet partition as the join wrote it: no Criteo text copy.
    holdout = tmp_path / "work" / "data" / "holdout" / partition_name(first + 1)
    manifest = json.loads((tmp_path / "repo" / "1" / "assets.extra" / "manifest.json").read_text())
    assert manifest["quality_gate"]["eval_rows"].startswith(f"{holdout} (")
    assert sorted(p.name for p in (tmp_path / "work" / "runs" / str(first + 1)).iterdir()) == [
        "data",
        "run",
        "train.log",
    ]
    assert "val AUC" in (tmp_path / "work" / "runs" / str(first + 1) / "train.log").read_text()


def test_train_args_become_the_typed_config_each_interval_runs_from() -> None:
    assert train_config(3, "--batch-size 512 --val-fraction 0.2") == TrainConfig(
        max_epochs=3, batch_size=512, val_fraction=0.2
    )
    assert train_config(1, "--max-epochs 2") == TrainConfig(max_epochs=2)  # as written, the option wins
    assert Settings(Path("l"), Path("c"), Path("r"), Path("w"), 1.0, 0.0).train == TrainConfig(max_epochs=1)


@pytest.mark.parametrize(
    ("train_args", "message"),
    [
        ("--batch-size 0", "invalid --batch-size: 0"),
        (
            "--data x.txt --init-from v1",
            "--data, --init-from: the trainer sets these for each interval; leave them out",
        ),
    ],
)
def test_train_args_that_make_no_interval_run_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], train_args: str, message: str
) -> None:
    argv = ["--logs", str(tmp_path), "--clicks", str(tmp_path), "--work", str(tmp_path / "work")]
    assert main([*argv, "--train-args", train_args]) == 2
    assert capsys.readouterr().err == f"online: error: --train-args: {message}\n"
    assert not (tmp_path / "work").exists()


def test_a_restart_after_publishing_but_before_recording_finishes_the_interval_without_training(
    tmp_path: Path,
):
    s = Settings(
        tmp_path / "logs", tmp_path / "clicks", tmp_path / "repo", tmp_path / "work", INTERVAL_S, WINDOW_S
    )
    save(s.work, State(INTERVAL_S, WINDOW_S, next=7, pending={"interval": 7, "version": 3}))
    (s.repo / "3").mkdir(parents=True)  # the export finished; the kill came before the state was written
    trainer = Trainer(s, TrainerMetrics())
    assert trainer.state.next == 8 and trainer.state.pending is None
    assert [(o["interval"], o["outcome"], o["version"]) for o in trainer.state.outcomes] == [
        (7, "published", 3)
    ]
    assert load(s.work) == trainer.state
    assert not (s.work / "runs").exists()  # nothing was trained


def test_a_restart_whose_pending_version_never_appeared_trains_the_interval_again(tmp_path: Path):
    s = Settings(
        tmp_path / "logs", tmp_path / "clicks", tmp_path / "repo", tmp_path / "work", INTERVAL_S, WINDOW_S
    )
    save(s.work, State(INTERVAL_S, WINDOW_S, next=7, pending={"interval": 7, "version": 3}))
    trainer = Trainer(s, TrainerMetrics())
    assert (trainer.state.next, trainer.state.pending, trainer.state.outcomes) == (7, None, [])


def test_an_empty_interval_trains_nothing_and_says_so(tmp_path: Path):
    s = Settings(
        tmp_path / "logs", tmp_path / "clicks", tmp_path / "repo", tmp_path / "work", INTERVAL_S, WINDOW_S
    )
    trainer = Trainer(s, TrainerMetrics(), first=5)
    outcome = trainer.run_interval(5)
    assert (outcome["outcome"], outcome["rows"], outcome["why"]) == (
        "empty",
        0,
        "no rows to train on: nothing trained",
    )
    assert load(s.work).next == 6 and not (s.work / "runs").exists()  # type: ignore[union-attr]
    assert trainer.metrics.intervals.labels("empty")._value.get() == 1


def test_a_full_disk_drops_the_interval_counts_it_and_keeps_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import errno

    import pipelines.online.loop as loop

    s = Settings(
        tmp_path / "logs", tmp_path / "clicks", tmp_path / "repo", tmp_path / "work", INTERVAL_S, WINDOW_S
    )
    trainer = Trainer(s, TrainerMetrics(), first=5)

    def full(*_: object) -> None:
        raise OSError(
            errno.ENOSPC, "No space left on device", str(s.work / "data" / "train" / partition_name(5))
        )

    monkeypatch.setattr(loop, "join", full)
    outcome = trainer.run_interval(5)
    assert outcome["outcome"] == "dropped" and "No space left on device" in outcome["why"]
    assert trainer.metrics.dropped._value.get() == 1
    assert load(s.work).next == 6  # type: ignore[union-attr]


def test_metrics_expose_freshness_outcomes_and_refusals():
    from prometheus_client import generate_latest

    m = TrainerMetrics()
    m.served_row_time(time.time() - 100)
    m.intervals.labels("refused").inc()
    m.gate_refusals.inc()
    text = generate_latest(m.registry).decode()
    [age] = [
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("ctr_online_freshness_seconds ")
    ]
    assert 100 <= age < 105
    assert 'ctr_online_intervals_total{outcome="refused"} 1.0' in text
    assert "ctr_online_gate_refusals_total 1.0" in text
    assert 'ctr_online_clicks_total{kind="late clicks"} 0.0' in text
