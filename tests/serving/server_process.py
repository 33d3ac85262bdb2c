"""Start and stop a real `python -m serving` process on 127.0.0.1 free ports, for the tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import REPO_ROOT, free_port


class ServerProcess:
    """A running server; `url(path)` for REST, `grpc_target` for gRPC; `stop()` sends SIGTERM."""

    def __init__(
        self,
        base_path: Path | None,
        log_path: Path,
        *flags: str,
        model_name: str = "ctr",
        cwd: Path = REPO_ROOT,
    ) -> None:
        """`base_path` None: the models come from a `--model_config_file` among `flags`; `cwd`: the checkout
        whose `serving` runs (another one than this, e.g. the tree before a change, with this interpreter)."""
        self.rest_port, self.grpc_port = free_port(), free_port()
        self.model_name, self.log_path = model_name, log_path
        cmd = [
            sys.executable,
            "-m",
            "serving",
            "--host=127.0.0.1",
            f"--port={self.grpc_port}",
            f"--rest_api_port={self.rest_port}",
            *([f"--model_name={model_name}", f"--model_base_path={base_path}"] if base_path else []),
            *flags,
        ]
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT)
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.rest_port}{path}"

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll the readiness endpoint (model status) until it answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            status, _ = http(self.url(f"/v1/models/{self.model_name}"), timeout=2)
            if status == 200:
                return
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout_s}s:\n{self.log()}")

    def wait_versions(self, versions: set[int], timeout_s: float = 60.0) -> None:
        """Poll the model status until every one of `versions` is AVAILABLE (wait_ready sees the first only)."""
        deadline = time.monotonic() + timeout_s
        available: set[int] = set()
        while time.monotonic() < deadline:
            status, body = http(self.url(f"/v1/models/{self.model_name}"), timeout=2)
            if status == 200 and isinstance(body, dict):
                available = {
                    int(v["version"])
                    for v in body.get("model_version_status", [])
                    if v.get("state") == "AVAILABLE"
                }
                if versions <= available:
                    return
            time.sleep(0.1)
        raise TimeoutError(
            f"versions {sorted(versions - available)} not available after {timeout_s}s:\n{self.log()}"
        )

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait; SIGKILL if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


def http(
    url: str, body: Any = None, raw: bytes | None = None, method: str | None = None, timeout: float = 10
) -> tuple[int, Any]:
    """One HTTP request; returns (status, parsed JSON or text) without raising on 4xx/5xx."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode()


def wait_for_inflight(server: ServerProcess, n: int, timeout_s: float = 20.0) -> None:
    """Poll the metrics until `ctr_serving_inflight_requests` is `n` (e.g. requests held in a batching window)."""
    series = f'ctr_serving_inflight_requests{{model_name="{server.model_name}"}} '
    deadline = time.monotonic() + timeout_s
    while True:
        _, text = http(server.url("/metrics"))
        values = [line[len(series) :] for line in str(text).splitlines() if line.startswith(series)]
        if values and float(values[0]) == n:
            return
        assert time.monotonic() < deadline, f"in-flight requests {values}, expected {n}:\n{server.log()}"
        time.sleep(0.02)


def env_without_proxy() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


REPOSITORY_POLLS = "ctr_serving_repository_polls_total"
CONFIG_POLLS = "ctr_serving_model_config_polls_total"


def polls(server: ServerProcess, metric: str = REPOSITORY_POLLS) -> int:
    """Polls the server has finished: of the model base path (every model), or of --model_config_file."""
    _, text = http(server.url("/metrics"))
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in str(text).splitlines()
            if line.startswith((metric + "{", metric + " "))
        )
    )


def wait_polls(
    server: ServerProcess, n: int, timeout_s: float = 30.0, metric: str = REPOSITORY_POLLS
) -> None:
    """Wait until `n` more polls have finished than when called (instead of sleeping n poll intervals)."""
    target = polls(server, metric) + n
    deadline = time.monotonic() + timeout_s
    while polls(server, metric) < target:
        assert time.monotonic() < deadline, f"fewer than {n} polls within {timeout_s}s:\n{server.log()}"
        time.sleep(0.05)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll `condition` every 50 ms until it holds; fail naming `what` after `timeout_s` (never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.05)
