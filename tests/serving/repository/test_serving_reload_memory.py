"""Every hot reload frees what it loaded (issue 44): the server's memory stays flat across reloads.

A realistic version (`python -m export` of a run whose spec has thousands of values a field: calibrated `ctr`
and `raw_score`, the raw signature served through the spec, drift reference, warm-up, SavedModel) is published
50 more times under new numbers, the operator's way (copied beside the versions, renamed into place), with no
traffic; each reload waits until the model status shows the new version AVAILABLE and the old one END. The
resident memory of the server's whole process tree after the 50th reload must be within 32 MiB of what it was
after the 2nd: a version kept alive after its unload costs megabytes, so 48 of them cannot hide. Each measure
waits for the unloaded version's `reclaimed` line (serving/repository/reclaim.py), and no line may name a
version still referenced after its unload. Then hostile clients (bench/http_attack.py, in its own process)
with six reloads among them: within 64 MiB. The figures: docs/perf/serving-memory.md; `-s` prints them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.serving.reload_memory import (
    MIB,
    export_version,
    labelled_versions,
    leaks,
    publish,
    reclaimed,
    reload,
    tree_rss,
    wait_log,
    wait_states,
)
from tests.serving.server_process import ServerProcess, http

pytestmark = pytest.mark.slow

RELOADS = 50
FLAT_MIB = 32
HOSTILE_MIB = 64
POLL = ("--file_system_poll_wait_seconds=0.05",)


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One version folder as export publishes it (exported once for the module)."""
    return export_version(tmp_path_factory.mktemp("export"))


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Servers started by a test; every one is stopped at teardown."""
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


def _serve(servers: list[ServerProcess], tmp_path: Path, base: Path | None, *flags: str) -> ServerProcess:
    server = ServerProcess(base, tmp_path / f"server{len(servers)}.log", *POLL, *flags)
    servers.append(server)
    server.wait_ready(120)
    return server


def _base(tmp_path: Path, version: Path, *numbers: int) -> Path:
    base = tmp_path / "models" / "ctr"
    base.mkdir(parents=True)
    for n in numbers:
        publish(version, base, n)
    return base


def _check_flat(
    server: ServerProcess, measures: dict[int, int], times: list[float], what: str, served: set[int]
) -> None:
    """Print the figures; no leak line; metric series of the `served` versions only; RSS after the last reload
    within FLAT_MIB of after the 2nd."""
    start, end = measures[2], measures[RELOADS]
    assert labelled_versions(server) <= served, (
        f"metric series of unloaded versions: {labelled_versions(server)}"
    )
    print(
        f"{what}: {RELOADS} reloads, {sum(times):.1f} s (median {sorted(times)[len(times) // 2]:.2f} s, max "
        f"{max(times):.2f} s); tree RSS after reload 2: {start / MIB:.0f} MiB, after {RELOADS}: {end / MIB:.0f} "
        f"MiB ({(end - start) / MIB:+.1f})"
    )
    assert not leaks(server), leaks(server)
    assert end - start <= FLAT_MIB * MIB, f"{what}: RSS {start / MIB:.0f} -> {end / MIB:.0f} MiB"


def _reload_fifty(server: ServerProcess, version: Path, base: Path, workers: int = 1) -> tuple[dict, list]:
    """Reloads 1..50 publish versions 2..51; the tree's RSS once the 2nd's and the 50th's old version is reclaimed."""
    measures: dict[int, int] = {}
    times: list[float] = []
    wait_log(server, rf"\b{server.model_name} version 1 available\b", count=workers)  # every worker is up
    for n in range(1, RELOADS + 1):
        times.append(reload(server, version, base, n + 1))
        if workers > 1:  # the status answers from one worker: wait for every worker's unload
            wait_log(server, rf"unloaded {server.model_name} version {n}\b", count=workers)
        if n in (2, RELOADS):
            reclaimed(server, n, workers)
            measures[n] = tree_rss(server.proc.pid)
    return measures, times


@pytest.mark.parametrize("workers", [1, 2])
def test_fifty_reloads_keep_the_memory_flat(
    version: Path, tmp_path: Path, servers: list[ServerProcess], workers: int
) -> None:
    base = _base(tmp_path, version, 1)
    server = _serve(servers, tmp_path, base, *([f"--num_workers={workers}"] if workers > 1 else []))
    measures, times = _reload_fifty(server, version, base, workers)
    _check_flat(server, measures, times, f"onnx, {workers} worker(s)", {RELOADS + 1})


def test_fifty_reloads_on_tensorflow_keep_the_memory_flat(
    version: Path, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    base = _base(tmp_path, version, 1)
    server = _serve(servers, tmp_path, base, "--backend=tf")
    measures, times = _reload_fifty(server, version, base)
    _check_flat(server, measures, times, "tf", {RELOADS + 1})


def _config(path: Path, base: Path, stable: int, canary: int) -> None:
    """The model config: the two versions served, `stable` and `canary` labels on them; written whole, renamed."""
    text = f"""model_config_list {{
  config {{
    name: "ctr"
    base_path: "{base}"
    model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: {stable} versions: {canary} }} }}
    version_labels {{ key: "stable" value: {stable} }}
    version_labels {{ key: "canary" value: {canary} }}
  }}
}}
# ctr-traffic: model=ctr canary_percent=10
"""
    staged = path.with_name(path.name + ".new")
    staged.write_text(text)
    staged.replace(path)


def test_fifty_reloads_with_labels_moving_in_the_model_config_keep_the_memory_flat(
    version: Path, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """Each reload publishes version v and moves the labels: stable on v - 1, canary on v; v - 2 goes."""
    base = _base(tmp_path, version, 1, 2)
    config = tmp_path / "models.config"
    _config(config, base, 1, 2)
    server = _serve(
        servers, tmp_path, None, f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=0.05"
    )
    wait_states(server, {1: "AVAILABLE", 2: "AVAILABLE"})
    measures: dict[int, int] = {}
    times: list[float] = []
    for n in range(1, RELOADS + 1):
        started, v = time.monotonic(), n + 2
        publish(version, base, v)
        _config(config, base, v - 1, v)
        wait_states(server, {v: "AVAILABLE", v - 1: "AVAILABLE", v - 2: "END"})
        times.append(time.monotonic() - started)
        if n in (2, RELOADS):
            reclaimed(server, v - 2)
            measures[n] = tree_rss(server.proc.pid)
    status, body = http(server.url("/v1/models/ctr/labels/canary/metadata"))
    assert status == 200 and body["model_spec"]["version"] == str(RELOADS + 2), body
    _check_flat(server, measures, times, "model config, labels moving", {RELOADS + 1, RELOADS + 2})


def _open_connections(server: ServerProcess) -> float:
    _, text = http(server.url("/metrics"))
    match = re.search(r"^ctr_serving_open_connections (\S+)$", str(text), re.MULTILINE)
    assert match, text
    return float(match.group(1))


def test_hostile_clients_and_six_reloads_give_the_memory_back(
    version: Path, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    base = _base(tmp_path, version, 1)
    server = _serve(
        servers,
        tmp_path,
        base,
        "--header_timeout_seconds=2",
        "--body_timeout_seconds=2",
        "--keepalive_timeout_seconds=5",
    )
    row = b'{"instances": [{"I1": 3, "I2": 20, "C1": "68fd1e64", "C2": "80e26c9b"}]}'
    for _ in range(20):  # warm-up: the allocator, the model, the body decoder's child
        assert http(server.url("/v1/models/ctr:predict"), raw=row)[0] == 200
    start = tree_rss(server.proc.pid)
    attack = subprocess.Popen(
        [sys.executable, "-m", "bench.http_attack", f"--port={server.rest_port}", "--seconds=10"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        times = [reload(server, version, base, v) for v in range(2, 8)]
        out, _ = attack.communicate(timeout=60)
    finally:
        attack.kill()
    deadline = time.monotonic() + 15
    while _open_connections(server) > 1 and time.monotonic() < deadline:  # 1: this scrape
        time.sleep(0.2)
    reclaimed(server, 6)
    assert http(server.url("/v1/models/ctr:predict"), raw=row)[0] == 200
    end = tree_rss(server.proc.pid)
    print(
        f"hostile: 6 reloads in {sum(times):.1f} s during the attack {out.strip()}; tree RSS {start / MIB:.0f} -> "
        f"{end / MIB:.0f} MiB ({(end - start) / MIB:+.1f})"
    )
    assert attack.returncode == 0, out
    assert not leaks(server), leaks(server)
    assert end - start <= HOSTILE_MIB * MIB, f"RSS {start / MIB:.0f} -> {end / MIB:.0f} MiB"
