"""Fixtures: a generated model repository (ONNX + SavedModel + assets.extra) and running servers."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.serving.model_repo import make_weights, write_saved_model, write_version
from tests.serving.server_process import ServerProcess

StartServer = Callable[..., ServerProcess]


@pytest.fixture(scope="session")
def weights() -> dict[int, list[np.ndarray]]:
    """Weights of versions 1, 2 and 3 (different seeds, so the versions predict differently)."""
    return {v: make_weights(seed=v) for v in (1, 2, 3)}


@pytest.fixture(scope="session")
def saved_model_v1(tmp_path_factory: pytest.TempPathFactory, weights: dict[int, list[np.ndarray]]) -> Path:
    path = tmp_path_factory.mktemp("saved_model") / "v1"
    write_saved_model(weights[1], path)
    return path


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory, weights, saved_model_v1: Path) -> Path:
    """A read-only repository `<repo>/ctr/1/` with both model.onnx and saved_model.pb."""
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo / "ctr", 1, weights[1], saved_model_from=saved_model_v1)
    return repo / "ctr"


@pytest.fixture
def writable_base(tmp_path: Path, model_repo: Path) -> Path:
    """A private copy of the base path, for tests that add, corrupt or delete versions."""
    base = tmp_path / "ctr"
    shutil.copytree(model_repo, base)
    return base


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start servers on free ports (waiting for readiness); every one is stopped at teardown."""
    started: list[ServerProcess] = []

    def start(base_path: Path, *flags: str, wait: bool = True) -> ServerProcess:
        server = ServerProcess(base_path, tmp_path / f"server{len(started)}.log", *flags)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory, model_repo: Path) -> Iterator[ServerProcess]:
    """One ONNX server (batching off) shared by a module's read-only tests."""
    server = ServerProcess(
        model_repo, tmp_path_factory.mktemp("logs") / "server.log", "--version_labels=stable=1"
    )
    server.wait_ready()
    yield server
    server.stop()
