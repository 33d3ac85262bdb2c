"""Memory back after the storm (issue 34): hostile clients against one worker, then RSS within 64 MiB of start.

The storm is bench/http_attack.py's, all kinds at once: slow partial requests, 8 MiB pathological bodies, 40
bodies held one byte short of the 8 MiB limit, and a pipelined flood that never reads. RSS (VmRSS) is sampled
through it; at the end the server's own memory report (serving/http/memory.py, CTR_SERVING_MEMORY_REPORT) says
whether what is left is live allocations or free heap that malloc kept. The figures: docs/perf/serving-memory.md.
`-s` prints them; CTR_STORM_SECONDS, CTR_STORM_ROUNDS and CTR_STORM_FLAGS (extra server flags) vary the storm.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.serving.server_process import ServerProcess, http

STORM_S = float(os.environ.get("CTR_STORM_SECONDS", "6"))
ROUNDS = int(os.environ.get("CTR_STORM_ROUNDS", "2"))
FLAGS = ("--header_timeout_seconds=2", "--body_timeout_seconds=2", "--keepalive_timeout_seconds=5")
BODY = json.dumps({"instances": [[0.25] * 128]}).encode()


def _report(server: ServerProcess, path: Path) -> dict:
    """Ask the server for a memory report (SIGUSR2) and return it."""
    before = path.read_text().count("\n") if path.exists() else 0
    server.proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) > before:
            return json.loads(lines[-1])
        time.sleep(0.05)
    raise TimeoutError("no memory report")


def _open_connections(server: ServerProcess) -> float:
    _, text = http(server.url("/metrics"))
    match = re.search(r"^ctr_serving_open_connections (\S+)$", str(text), re.MULTILINE)
    assert match, text
    return float(match.group(1))


def _storm(server: ServerProcess) -> tuple[int, dict]:
    """One storm; returns the peak RSS sampled during it and the attack's tally."""
    peak, done = [server.rss_bytes()], threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], server.rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    attack = subprocess.Popen(
        [sys.executable, "-m", "bench.http_attack", f"--port={server.rest_port}", f"--seconds={STORM_S}"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out, _ = attack.communicate(timeout=STORM_S + 30)
    finally:
        attack.kill()
        done.set()
        sampler.join()
    deadline = time.monotonic() + 10
    while _open_connections(server) > 1 and time.monotonic() < deadline:  # 1: the scrape itself
        time.sleep(0.2)
    return peak[0], json.loads(out)


def _mib(n: int) -> int:
    return n >> 20


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_rss_returns_within_64_mib_after_the_storm(
    start_server, model_repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report_path = tmp_path / "memory.jsonl"
    monkeypatch.setenv("CTR_SERVING_MEMORY_REPORT", str(report_path))
    server = start_server(model_repo, *FLAGS, *os.environ.get("CTR_STORM_FLAGS", "").split())
    for _ in range(20):  # warm-up: the allocator, the model, the decoder child
        assert http(server.url("/v1/models/ctr:predict"), raw=BODY)[0] == 200
    time.sleep(0.5)
    start = _report(server, report_path)
    rounds = []
    for _ in range(ROUNDS):
        peak, tally = _storm(server)
        time.sleep(1.0)  # the sweep hands the freed bodies back
        end = _report(server, report_path)
        rounds.append((peak, end, tally))
    lines = [f"storm: RSS start {_mib(start['rss'])} MiB; malloc {start.get('malloc')}"]
    for peak, end, tally in rounds:
        lines.append(
            f"  peak {_mib(peak)} end {_mib(end['rss'])} MiB; traced {end.get('traced')}; malloc "
            f"{end.get('malloc')}; {tally['dropped']} {tally['pathological']}"
        )
    lines += end.get("top", [])
    print("\n".join(lines))  # -s shows it
    assert rounds[0][2]["dropped"]["holders"] == 40, rounds[0][2]
    for _, end, _ in rounds:
        assert end["rss"] - start["rss"] < 64 << 20, "\n".join(lines)


CHUNK = b"%x\r\n%s\r\n" % (1 << 20, b"1" * (1 << 20))


async def _oversized_chunked(port: int) -> bytes:
    """A chunked body that never ends: the server answers 413 once it passes --max_body_bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    answer = asyncio.ensure_future(reader.readline())
    try:
        for _ in range(12):
            if answer.done():
                break
            writer.write(CHUNK)
            await writer.drain()
        return await asyncio.wait_for(answer, 10)
    except (ConnectionError, TimeoutError):
        return b"reset"
    finally:
        writer.close()


async def _refused_bodies(port: int, n: int) -> list[bytes]:
    pathological = b'{"instances": [' + b"[]," * ((8 << 20) // 3 - 10) + b"[]]}"
    for _ in range(2):  # an 8 MiB body freed raises glibc's mmap threshold: later bodies land in the heap
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        writer.write(head % len(pathological) + pathological)
        await reader.readline()
        writer.close()
    return await asyncio.gather(*(_oversized_chunked(port) for _ in range(n)))


def test_rss_returns_after_bodies_refused_midway(
    start_server, model_repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bodies dropped by a 413 or 503 while they arrive are freed memory too: it must come back."""
    report_path = tmp_path / "memory.jsonl"
    monkeypatch.setenv("CTR_SERVING_MEMORY_REPORT", str(report_path))
    server = start_server(model_repo, *FLAGS, "--max_buffered_bytes=1073741824")
    assert http(server.url("/v1/models/ctr:predict"), raw=BODY)[0] == 200
    start = _report(server, report_path)
    answers = asyncio.run(_refused_bodies(server.rest_port, 16))
    time.sleep(2.0)
    end = _report(server, report_path)
    print(f"refused: RSS {_mib(start['rss'])} -> {_mib(end['rss'])} MiB; {end.get('malloc')}; {set(answers)}")
    assert set(answers) <= {b"HTTP/1.1 413 Request Entity Too Large\r\n", b"reset"}, answers
    assert end["rss"] - start["rss"] < 64 << 20, f"RSS {_mib(start['rss'])} -> {_mib(end['rss'])} MiB"


def test_the_end_of_a_burst_is_trimmed_and_refused_bodies_count() -> None:
    """The sweep's trigger: every 16 MiB dropped, and whatever large bodies were dropped once a second is quiet."""
    from serving.http.shared import ConnectionBudget, HttpLimits
    from serving.observability.metrics import ServingMetrics

    budget = ConnectionBudget(HttpLimits(), ServingMetrics())
    assert not budget.take_freed(16 << 20, 1.0)  # nothing dropped: no trim
    budget.hold_body(8 << 20)
    budget.drop_body(8 << 20)  # a body refused midway (413 / 503) is freed memory too
    assert budget.buffered_bytes == 0
    assert not budget.take_freed(16 << 20, 1.0)  # under 16 MiB, and just now
    budget.freed_at -= 1.5  # a second and a half without another large body
    assert budget.take_freed(16 << 20, 1.0)
    assert not budget.take_freed(16 << 20, 1.0)  # the count restarted
    budget.count_freed(1 << 10)  # small bodies never count
    assert budget.freed_bytes == 0
    budget.count_freed(20 << 20)
    assert budget.take_freed(16 << 20, 1.0)
