"""`--loader auto` sizes itself from the container's memory limit (cgroup), not from the node's RAM."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctr_contract import cgroup
from training.data.parquet import ParquetData, Piece
from training.loader.inputs import choose_loader

MIB = 1 << 20


def data_of(train_rows: int, val_rows: int) -> ParquetData:
    """A data set's row counts (one row group), which is all choose_loader reads of it."""
    piece = Piece(0, 0, 0, train_rows + val_rows, 0, 0, train_rows, 0, val_rows)
    return ParquetData([], [], [], [piece], val_fraction=0.1)


def test_auto_loader_streams_when_the_cgroup_memory_limit_is_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "memory.max").write_text(f"{512 * MIB}\n")  # cgroup v2, a 512 MiB pod
    (tmp_path / "memory.current").write_text(f"{112 * MIB}\n")
    (tmp_path / "memory.stat").write_text("inactive_file 0\n")
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    data = data_of(180_000, 20_000)  # 200k rows x 128 float32 = 97.7 MiB of features
    # budget: (512 - 112) MiB of headroom / 4 per process = 100 MiB for 1 process, 50 MiB each for 2
    assert choose_loader("auto", data, 128, local_ranks=1) == (
        "memory",
        "features take 98 MiB per process <= 100 MiB",
    )
    assert choose_loader("auto", data, 128, local_ranks=2) == (
        "stream",
        "features would take 98 MiB per process > 50 MiB",
    )
