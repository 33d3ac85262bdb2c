"""Shared export fixtures: tiny training run dirs built here, and exports shared across the session.

Exports are slow-ish (TF import, SavedModel write), so each (activation, target) case is exported once
per session into its own repository and the tests read the published files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from export_runs import make_run

from export.__main__ import main as export_main


@dataclass(frozen=True)
class Published:
    """One session export: its run dir, model base path and version folder."""

    run: Path
    repo: Path
    version_dir: Path


@pytest.fixture(scope="session")
def published(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Published]:
    """Export (activation, target profile) once per session; returns a lookup function."""
    cache: dict[tuple[str, str], Published] = {}

    def get(activation: str, target: str = "standard") -> Published:
        key = (activation, target)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"export-{activation}-{target}")
            run = make_run(root / "run", activation)
            repo = root / "models" / "ctr"
            assert export_main(["--run", str(run), "--repo", str(repo), "--target", target]) == 0
            cache[key] = Published(run, repo, repo / "1")
        return cache[key]

    return get
