"""Training test fixtures: small synthetic Criteo files."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.synth import generate


@pytest.fixture(scope="session")
def synth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4000 synthetic rows in Kaggle TSV form, with the oracle files beside them (shared, treat as read-only)."""
    path = tmp_path_factory.mktemp("synth") / "train.txt"
    generate(path, rows=4000, seed=3)
    return path


@pytest.fixture
def data_copy(synth_file: Path, tmp_path: Path) -> Path:
    """A private copy of the synthetic file (tests that build caches or runs beside it)."""
    dst = tmp_path / "data" / "train.txt"
    dst.parent.mkdir()
    for src in synth_file.parent.glob("train.txt*"):
        if ".cache." not in src.name:
            (dst.parent / src.name).write_bytes(src.read_bytes())
    return dst
