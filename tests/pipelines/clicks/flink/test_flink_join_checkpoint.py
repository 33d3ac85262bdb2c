"""The Flink click join restarted from its checkpoint neither loses nor repeats an interval's rows.

A continuous job (the filesystem sources monitoring the folders, checkpoints every 0.5 s) reads request log and
click files as they are renamed in, 5 s of event time each. Once a checkpoint holds the first files, more files
come and the job is killed (SIGKILL, its whole process group) with the interval starting at T half read, and the files the
checkpoint covers are taken away: only the restored state still knows their requests and clicks. The job
restarts from the checkpoint, the rest of the files come, and the intervals before, at and after T must equal the embedded
join's over every file (rows, columns, counts).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.clicks.flink.config import JobConfig
from pipelines.clicks.flink.engine import flink_python, read_report, start_job
from pipelines.clicks.flink.output import report_path
from pipelines.clicks.join import join_interval, partition_name
from tests.pipelines.flink_inputs import T, iso

INTERVAL_S, WINDOW_S, CHUNK_S = 20.0, 5.0, 5.0
N0 = int(T // INTERVAL_S)  # a continuous job's intervals are aligned to the Unix epoch: N0 starts at T
INTERVALS = [[n, n * INTERVAL_S, (n + 1) * INTERVAL_S] for n in (N0 - 1, N0, N0 + 1)]

pytestmark = [
    pytest.mark.skipif(
        flink_python() is None,
        reason="no Flink venv (.venv-flink): `make flink-venv` installs apache-flink + Java 17",
    ),
    pytest.mark.slow,
]


def _chunks(seed: int = 3) -> dict[int, tuple[list[str], list[str]]]:
    """Chunk k (event times [T + 5k, T + 5k + 5)): its request log lines and click lines, in time order."""
    rng = random.Random(seed)
    out: dict[int, tuple[list[str], list[str]]] = {k: ([], []) for k in range(-5, 15)}
    clicks: list[tuple[float, str]] = []
    for j in range(800):
        t = T - 20 + j * 0.1
        rid = f"q{j:04d}"
        row = {"I1": j % 7, "C1": f"{j:08x}"}
        line = {"request_id": rid, "time": iso(t), "model": {"name": "ctr", "version": 1, "label": None}}
        line |= {"inputs": {"instances": [row, row]}, "outputs": [[0.2], [0.3]]}
        out[int((t - T) // CHUNK_S)][0].append(json.dumps(line))
        if j % 13 == 0:
            out[int((t - T) // CHUNK_S)][0].append("{broken")
        for i in (0, 1):
            if rng.random() < 0.3:
                dt = rng.choice((rng.uniform(0, WINDOW_S), rng.uniform(WINDOW_S, WINDOW_S + 3), -0.05))
                c = json.dumps({"request_id": rid, "instance": i, "time": t + dt})
                clicks += [(t + dt, c)] * (2 if rng.random() < 0.1 else 1)
    for t, c in sorted(clicks):
        out[int((t - T) // CHUNK_S)][1].append(c)
    return out


def _drop(folder: Path, name: str, lines: list[str], mtime: float) -> None:
    """A finished file renamed in (the hidden temporary name is read by neither engine)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text("".join(x + "\n" for x in lines))
    os.utime(tmp, (mtime, mtime))
    tmp.replace(folder / name)


def _drop_chunks(root: Path, chunks: dict, ks: range) -> list[Path]:
    paths = []
    for k in ks:
        reqs, clicks = chunks[k]
        mtime = T + CHUNK_S * (k + 1) + 0.5
        _drop(root / "logs" / "pod-0", f"requests-0-{k + 10:03d}.jsonl", reqs, mtime)
        paths.append(root / "logs" / "pod-0" / f"requests-0-{k + 10:03d}.jsonl")
        if clicks:
            _drop(root / "clicks", f"clicks-{k + 10:03d}.jsonl", clicks, mtime)
            paths.append(root / "clicks" / f"clicks-{k + 10:03d}.jsonl")
        time.sleep(0.3)
    return paths


def _checkpoints(folder: Path) -> list[Path]:
    """Completed checkpoints (chk-N with its _metadata), oldest first."""
    done = [p.parent for p in folder.glob("*/chk-*/_metadata")]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def _newest(folder: Path) -> int:
    """The number of the newest completed checkpoint (0: none yet)."""
    return max((int(c.name.split("-")[1]) for c in _checkpoints(folder)), default=0)


def _wait(what, timeout_s: float, proc) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert proc.poll() is None, f"the job ended (exit {proc.returncode})"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _kill(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_job_killed_mid_interval_resumes_from_its_checkpoint(tmp_path: Path):
    chunks = _chunks()
    reports, ckpt = tmp_path / "reports", tmp_path / "checkpoints"
    cfg = JobConfig(
        requests={"connector": "filesystem", "path": str(tmp_path / "logs"), "monitor_interval_s": 0.2},
        clicks={"connector": "filesystem", "path": str(tmp_path / "clicks"), "monitor_interval_s": 0.2},
        out=str(tmp_path / "flink"),
        reports=str(reports),
        window_s=WINDOW_S,
        holdout=0.25,
        interval_s=INTERVAL_S,
        lag_s=12.0,
        idle_s=2.0,
        checkpoint_dir=str(ckpt),
        checkpoint_interval_s=0.5,
    )
    (tmp_path / "logs").mkdir()
    (tmp_path / "clicks").mkdir()
    first = start_job(cfg, tmp_path / "run1")
    try:
        _wait(lambda: bool(_checkpoints(ckpt)), 120, first)
        covered = _drop_chunks(tmp_path, chunks, range(-5, 2))  # up to T + 10: interval N0 half read
        time.sleep(2.0)
        seen = _newest(ckpt)
        _wait(lambda: _newest(ckpt) >= seen + 2, 120, first)
        _drop_chunks(tmp_path, chunks, range(2, 4))  # up to T + 20, maybe not yet in a checkpoint
        time.sleep(1.0)
    finally:
        _kill(first)
    assert not report_path(reports, N0).exists(), "interval N0 must still be open when the job is killed"
    restore = _checkpoints(ckpt)[-1]
    gone = tmp_path / "gone"
    for p in covered:  # only the restored state knows these now
        (gone / p.relative_to(tmp_path)).parent.mkdir(parents=True, exist_ok=True)
        p.replace(gone / p.relative_to(tmp_path))
    cfg.restore = str(restore)
    jobs = {p.name for p in ckpt.iterdir()}
    second = start_job(cfg, tmp_path / "run2")
    try:
        # Running (its first checkpoint taken) before new files come: a backlog found at once is read in no
        # particular order, and events further behind than the watermark's lag would be dropped.
        _wait(lambda: any(c.parent.name not in jobs for c in _checkpoints(ckpt)), 120, second)
        _drop_chunks(tmp_path, chunks, range(4, 15))
        _wait(lambda: all(report_path(reports, n).exists() for n, _, _ in INTERVALS), 90, second)
    finally:
        _kill(second)
    log = (tmp_path / "run2" / "job.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    shutil.copytree(gone, tmp_path, dirs_exist_ok=True)  # every file back, for the embedded join
    for n, start, end in INTERVALS:
        embedded = join_interval(
            tmp_path / "logs", tmp_path / "clicks", tmp_path / "emb", n, start, end, 5.0, 0.25
        )
        assert read_report(reports, n, start, end) == embedded, f"interval {n}"
        assert embedded.rows > 100 and embedded.counts.get("clicks", 0) > 20
        for part in ("train", "holdout"):
            a = pq.read_table(tmp_path / "emb" / part / partition_name(n))
            b = pq.read_table(tmp_path / "flink" / part / partition_name(n))
            assert a.equals(b), f"{part} of interval {n}"
