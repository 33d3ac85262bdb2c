"""The server makes no outside call: under strace, it connects to no non-loopback address and sends no DNS
query while it loads a model and serves, and it writes nothing under $HOME (onnxruntime's telemetry is off)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO_ROOT, free_port
from tests.serving.model_repo import WIDTH, make_weights, write_version
from tests.serving.server_process import http

pytestmark = pytest.mark.slow  # make test-slow: a server under strace

# onnxruntime's telemetry resolved its endpoint ~9 s after the first session was created; watch past that.
WATCH_S = 15.0
SOCKET_CALL = re.compile(r"^\d+\s+(connect|sendto|sendmsg)\((\d+), (.*)$")
INET = re.compile(
    r'sa_family=AF_INET6?, sin6?_port=htons\((\d+)\), .*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")'
)


def _strace() -> str:
    path = shutil.which("strace")
    if path is None:
        pytest.skip(
            "needs strace (Debian package `strace`; `make sysdeps` installs it) to audit the server's syscalls"
        )
    probe = subprocess.run([path, "-f", "-qq", "-e", "trace=none", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here (ptrace is not permitted): {probe.stderr.strip()}")
    return path


def outside_calls(trace: str) -> list[str]:
    """Syscalls that reach past loopback: a connect/send to a non-loopback address, or anything to port 53."""
    bad = []
    for line in trace.splitlines():
        match = SOCKET_CALL.match(line)
        if match is None:
            continue
        address = INET.search(match.group(3))
        if address is None:
            continue  # AF_UNIX, AF_NETLINK, or a send on an already connected socket (its connect is checked)
        port, ip4, ip6 = int(address.group(1)), address.group(2), address.group(3)
        ip = ip4 or ip6 or ""
        loopback = ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1")
        if port == 53 or not loopback:
            bad.append(line)
    return bad


def test_outside_call_audit_finds_dns_and_remote_connects():
    trace = "\n".join(
        [
            '12 connect(36, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16) = 0',
            '12 connect(7, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("13.69.109.130")}, 16) = 0',
            '12 connect(8, {sa_family=AF_INET, sin_port=htons(8501), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
            '12 connect(9, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT',
        ]
    )
    assert outside_calls(trace) == trace.splitlines()[:2]


def test_server_makes_no_outside_call_and_writes_nothing_under_home(tmp_path: Path):
    strace = _strace()
    base = tmp_path / "models"
    write_version(base, 1, make_weights(1))
    home, trace = tmp_path / "home", tmp_path / "server.strace"
    rest = free_port()
    cmd = [
        strace,
        "-f",
        "-qq",
        "-o",
        str(trace),
        "-e",
        "trace=bind,connect,sendto,sendmsg",
        "-e",
        "signal=none",
        sys.executable,
        "-m",
        "serving",
        "--host=127.0.0.1",
        f"--port={free_port()}",
        f"--rest_api_port={rest}",
        "--model_name=ctr",
        f"--model_base_path={base}",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORT_")}  # the server must set it itself
    env["HOME"] = str(home)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while http(f"http://127.0.0.1:{rest}/v1/models/ctr", timeout=2)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.2)
        ready = time.monotonic()
        body = {"instances": np.zeros((2, WIDTH)).tolist()}
        while time.monotonic() - ready < WATCH_S:
            status, answer = http(f"http://127.0.0.1:{rest}/v1/models/ctr:predict", body)
            assert status == 200, answer
            time.sleep(0.5)
    finally:
        # SIGTERM to the server itself (strace's child): strace would only detach on its own SIGTERM.
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    calls = trace.read_text()
    assert f"sin_port=htons({rest})" in calls  # the trace holds the server's own bind of its REST port
    assert outside_calls(calls) == []
    assert not home.exists(), f"the server wrote under $HOME: {sorted(p.name for p in home.rglob('*'))}"
