"""Soak: at least 50,000 keep-alive requests (wrk, POST via Lua) grow resident memory by at most 10%."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.serving.server_process import ServerProcess

pytestmark = [
    pytest.mark.slow,  # make test-slow: 50,000 requests
    pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (run `make sysdeps`)"),
]


def _wrk(server: ServerProcess, script: Path, seconds: int, connections: int = 8) -> int:
    """Run wrk; return the number of completed requests (asserting none failed)."""
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "-s",
            str(script),
            server.url("/v1/models/ctr:predict"),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
        check=True,
    ).stdout
    assert "Non-2xx" not in out and "Socket errors" not in out, out
    match = re.search(r"(\d+) requests in", out)
    assert match, out
    return int(match.group(1))


def test_soak_50k_requests_keeps_rss_within_10_percent(start_server, model_repo, tmp_path: Path) -> None:
    server = start_server(model_repo)
    script = tmp_path / "post.lua"
    body = json.dumps({"instances": [[round(0.01 * i, 2) for i in range(128)]]})
    script.write_text(
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body)}\n'
    )
    warmup = _wrk(server, script, 3)
    rss_after_warmup = server.rss_bytes()
    total = 0
    for _ in range(12):  # bounded: at most 12 x 5 s
        total += _wrk(server, script, 5)
        if total >= 50_000:
            break
    rss_end = server.rss_bytes()
    print(
        f"soak: {total} requests; RSS {rss_after_warmup / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB"
    )  # -s shows it
    assert total >= 50_000, f"only {total} requests in 60 s (after {warmup} warm-up requests)"
    assert rss_end <= 1.10 * rss_after_warmup, (
        f"RSS grew from {rss_after_warmup} to {rss_end} bytes over {total} requests"
    )
