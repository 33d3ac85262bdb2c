"""The rollout controller and a real server on one model config file: the server follows what the controller writes.

The server re-reads the file every second; the controller asks it for load states (`GET /v1/models/ctr`) and
fallbacks (its Prometheus metrics). A listed version becomes shadow only once the server reports it
AVAILABLE; a version that crashes on load is rolled back, and stable answers throughout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.rollout.controller import Controller
from pipelines.rollout.journal import Store
from pipelines.rollout.policy import Policy
from pipelines.rollout.server import ServerProbe
from tests.pipelines.rollout_env import add_broken_version, add_version, fig, write_config, write_snapshot
from tests.serving.model_repo import make_weights, reference_predict
from tests.serving.server_process import ServerProcess, http

ROW = np.random.default_rng(5).random((1, 128), dtype=np.float32)


def _until(c: Controller, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(c.decisions):
        assert time.monotonic() < deadline, (
            f"decisions so far: {[(d['action'], d['version']) for d in c.decisions]}"
        )
        c.tick()
        time.sleep(0.2)


def _label_version(server: ServerProcess, label: str) -> int | None:
    status, body = http(server.url(f"/v1/models/ctr/labels/{label}"))
    return int(body["model_version_status"][0]["version"]) if status == 200 else None


def test_the_server_follows_the_config_the_controller_writes(tmp_path: Path) -> None:
    base, config = tmp_path / "models" / "ctr", tmp_path / "models.config"
    base.mkdir(parents=True)
    add_version(base, 1)
    write_config(config, base, with_other=False)
    store, live = Store(tmp_path / "rollout"), tmp_path / "live"
    flags = (f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=1")
    server = ServerProcess(None, tmp_path / "server.log", *flags, "--file_system_poll_wait_seconds=1")
    try:
        server.wait_ready()
        policy = Policy(min_rows=1000, load_timeout_s=60)
        c = Controller(config, "ctr", live, store, policy, ServerProbe(server.url("")))
        assert [d["action"] for d in c.tick()] == ["promote"]  # the first version
        _until(c, lambda _: _label_version(server, "stable") == 1)

        add_version(base, 2)
        assert [d["action"] for d in c.tick()] == ["load"]
        assert c.tick() == [] or c.decisions[-1]["action"] == "shadow"  # shadow only once 2 is AVAILABLE
        _until(c, lambda ds: ds[-1]["action"] == "shadow")
        assert c.decisions[-1]["reason"] == "AVAILABLE on the server"
        _until(c, lambda _: _label_version(server, "shadow") == 2)
        assert c.probe is not None and c.probe.fallbacks("ctr") is not None  # the metrics answer
        status, body = http(server.url("/v1/models/ctr:predict"), {"instances": ROW.tolist()})
        assert status == 200  # unlabelled: stable's version 1 answers
        np.testing.assert_allclose(body["predictions"], reference_predict(make_weights(1), ROW), rtol=1e-5)

        write_snapshot(live, 1, fig(1, "stable", 0.75), fig(2, "shadow", 0.75, ratio=0.7))
        [rollback] = c.tick()
        assert rollback["action"] == "rollback" and "calibration ratio" in rollback["reason"]
        _until(c, lambda _: _label_version(server, "shadow") is None)

        add_broken_version(base, 3)  # files match the manifest, but model.onnx is no model: it fails to load
        assert [d["action"] for d in c.tick()] == ["load"]
        _until(c, lambda ds: ds[-1]["action"] == "rollback" and ds[-1]["version"] == 3)
        assert c.decisions[-1]["reason"].startswith("failed to load")
        assert [(d["action"], d["version"]) for d in c.decisions] == [
            ("promote", 1),
            ("load", 2),
            ("shadow", 2),
            ("rollback", 2),
            ("load", 3),
            ("rollback", 3),
        ]
        status, body = http(server.url("/v1/models/ctr:predict"), {"instances": ROW.tolist()})
        assert status == 200  # stable kept serving
        np.testing.assert_allclose(body["predictions"], reference_predict(make_weights(1), ROW), rtol=1e-5)
    finally:
        server.stop()
