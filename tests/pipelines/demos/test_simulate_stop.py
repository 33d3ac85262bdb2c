"""The traffic simulator stopped early still writes its counts: by SIGINT even when its parent ignored SIGINT
(a shell's background job), and by SIGTERM (a container's stop)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` in a non-interactive shell leaves it


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint-ignored-by-parent", "sigterm"])
def test_a_stopped_simulator_writes_its_counts(tmp_path: Path, sig: signal.Signals) -> None:
    listener = socket.create_server(
        ("127.0.0.1", 0)
    )  # takes each request's connection and closes it unanswered
    accepted: list[int] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    summary, log_path = tmp_path / "simulate.json", tmp_path / "simulate.log"
    cmd = [
        sys.executable,
        "-m",
        "pipelines.demos.simulate",
        "--url",
        f"http://127.0.0.1:{listener.getsockname()[1]}",
    ]
    cmd += [
        "--clicks-dir",
        str(tmp_path / "clicks"),
        "--duration",
        "600",
        "--rate",
        "50",
        "--summary",
        str(summary),
    ]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_ignore_sigint
        )
    try:
        deadline = time.monotonic() + 60
        while len(accepted) < 3:  # it is sending
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 1, log_path.read_text()  # stopped early; every request failed
    finally:
        proc.kill()
        proc.wait()
        listener.close()
    counts = json.loads(summary.read_text())
    assert counts["sent"] >= 3 and counts["failed"] == counts["sent"], counts
    assert "simulate: sent" in log_path.read_text()
