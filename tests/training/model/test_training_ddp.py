"""Real multi-process DDP on CPU (gloo): sharding, a checkpoint, and the rendezvous-timeout message."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ctr_model.checkpoint import load_net
from tests.training.train_runs import TINY_RUN

pytestmark = pytest.mark.slow  # make test-slow: two-process gloo DDP runs


def split_into_days(data: Path, parts: int) -> Path:
    """The fixture's lines as `parts` daily files in one directory (what `--data DIR` reads as one data set)."""
    lines = data.read_text().splitlines(keepends=True)
    days = data.parent / "days"
    days.mkdir()
    step = -(-len(lines) // parts)
    for i in range(parts):
        (days / f"day_{i}").write_text("".join(lines[i * step : (i + 1) * step]))
    return days


@pytest.mark.parametrize("loader", ["memory", "stream"])
def test_two_process_gloo_run_covers_each_sample_once_per_epoch(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess], loader: str
) -> None:
    out = tmp_path / "run"
    days = split_into_days(data_copy, 3)
    proc = run_module(
        "training",
        "--data",
        days,
        "--out",
        out,
        *TINY_RUN,
        "--devices",
        "2",
        "--accelerator",
        "cpu",
        "--strategy",
        "ddp",
        "--sample-audit",
        "--loader",
        loader,
        "--shuffle-buffer",
        "700",
        check=True,
    )
    assert "distributed_backend=gloo" in proc.stdout + proc.stderr
    assert f"data: {days} (3 files): read 4000 rows, no bad rows" in proc.stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["epochs"] == 2 and m["loader"] == loader
    assert m["train_rows"] + m["val_rows"] == 4000
    for epoch in range(2):
        shards = [np.load(out / "sample_audit" / f"epoch{epoch}_rank{rank}.npy") for rank in range(2)]
        assert abs(len(shards[0]) - len(shards[1])) <= 1
        seen = np.concatenate(shards)
        assert np.array_equal(np.sort(seen), np.arange(m["train_rows"]))  # every sample exactly once
    assert m["global_step"] == 2 * int(np.ceil(np.ceil(m["train_rows"] / 2) / 256))
    net, _ = load_net(out / "checkpoints" / "best.ckpt")
    assert net.cfg.width == 128
    # One process parsed each day into its cache: none left a private temporary copy behind.
    assert sorted(p.name for p in days.iterdir() if "cache" in p.name and p.suffix == ".parquet") == [
        f"day_{i}.cache.parquet" for i in range(3)
    ]


def test_missing_rank_fails_fast_naming_env_vars_and_shm(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "0", "WORLD_SIZE": "2"}
    # Node 0 of a 2-node job whose node 1 never starts.
    proc = run_module(
        "training",
        "--data",
        data_copy,
        "--out",
        tmp_path / "run",
        *TINY_RUN,
        "--num_nodes",
        "2",
        "--ddp-timeout",
        "3",
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "error: DDP ranks did not all meet within 3s" in proc.stderr
    for needle in (
        "MASTER_ADDR=127.0.0.1",
        f"MASTER_PORT={port}",
        "NODE_RANK=0",
        "WORLD_SIZE",
        "/dev/shm is",
    ):
        assert needle in proc.stderr
