"""The serving sections' harness: servers under test on 127.0.0.1, driven by wrk in interleaved rounds.

Used by `bench.sections.serving_load` (our server against its peers), `bench.sections.serving_tracing`,
`bench.raw_served` (our server in several forms: `our_server`) and `bench.http_layer` (our HTTP layer
against uvicorn and granian).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.harness import procs
from bench.harness.inputs import PROJECT_ROOT
from ctr_contract.repository import version_dirs

# TorchServe starts a JVM, then its Python worker, on a machine the other servers share.
STARTUP_TIMEOUT_S = 180
ERROR_GRACE_S = 30  # how long a server that answers predicts with errors has to answer one with 200
PREDICT_PATH = "/v1/models/ctr:predict"
_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_path_of(repo: Path) -> Path:
    """Accept the model base path (`.../ctr`) or the repository above it (`.../models`)."""
    if version_dirs(repo):
        return repo
    return repo / "ctr"


def write_lua(path: Path, instances: int) -> Path:
    """A wrk script that POSTs one fixed predict body with `instances` rows of 128 floats."""
    row = [round((i * 37 % 100) / 100, 2) for i in range(128)]
    return write_wrk_script(path, {"instances": [row] * instances})


def write_wrk_script(path: Path, body: dict[str, Any]) -> Path:
    """A wrk script that POSTs `body` as JSON on every request."""
    text = json.dumps(json.dumps(body))  # a Lua string literal holding the JSON body
    path.write_text(
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {text}\n'
    )
    return path


def parse_wrk(out: str) -> dict[str, float]:
    """QPS, p50/p90/p99 (ms) and the count of failed responses from `wrk --latency` output."""
    result: dict[str, float] = {"qps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}  # type: ignore[union-attr]
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.MULTILINE)
        result[f"p{pct}_ms"] = float(m.group(1)) * _UNITS_MS[m.group(2)] if m else float("nan")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["errors"] = float(errors.group(1) if errors else 0) + (
        sum(map(float, socket_errors.groups())) if socket_errors else 0
    )
    return result


def wait_until_serving(
    url: str, body: bytes, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120
) -> None:
    """POST a valid predict request until it answers 200.

    A server that listens but answers errors (still loading its model, or broken) gets ERROR_GRACE_S from its
    first error answer, not the whole `timeout_s`: a peer whose every predict fails costs seconds, not minutes.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{procs.log_tail(log)}")
        try:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as e:  # listening, but the predict failed
            deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
            answer = f"HTTP {e.code}: {e.read()[:200]!r}"
            if time.monotonic() + 0.25 >= deadline:
                raise RuntimeError(f"{url} answers {answer}:\n{procs.log_tail(log)}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        time.sleep(0.25)
    raise TimeoutError(f"{url} not serving after {timeout_s}s:\n{procs.log_tail(log)}")


class Server:
    """One server under test: its command, port and process (started by `start`).

    `path`, `cwd` and `env` differ from the defaults only for TorchServe (its own predictions API and launcher).
    """

    def __init__(
        self,
        name: str,
        cmd: list[str],
        port: int,
        path: str = PREDICT_PATH,
        cwd: Path = PROJECT_ROOT,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.cmd, self.port, self.cwd, self.env = name, cmd, port, cwd, env
        self.versions: Callable[[], dict[str, str]] | None = None  # a foreign venv's package versions
        self.url = f"http://127.0.0.1:{port}{path}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, workdir: Path, commands: list[str]) -> None:
        log = workdir / f"{re.sub(r'[^a-z0-9]+', '_', self.name.lower())}.log"
        commands.append(" ".join(self.cmd))
        self.proc = procs.start(self.cmd, log=log, cwd=self.cwd, env=self.env)
        body = json.dumps({"instances": [[0.5] * 128]}).encode()
        wait_until_serving(self.url, body, self.proc, log, timeout_s=STARTUP_TIMEOUT_S)


def our_server(
    name: str,
    base: Path,
    batching: bool,
    flags: Sequence[str] = (),
    checkout: Path | None = None,
    env: dict[str, str] | None = None,
    config_file: Path | None = None,
) -> Server:
    """Our server on `base` (REST on a free port of 127.0.0.1): one worker, one intra-op thread, warnings only.

    `flags`: more of the server's flags. `checkout`: another copy of the project to run it from (its code first
    on PYTHONPATH, e.g. the code before a change; the environment's PYTHONPATH, e.g. packages only that
    checkout needs, after it). `env`: the environment (default: this process's).
    `config_file`: serve the models of this `--model_config_file` instead of `base` alone.
    """
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "serving",
        "--host=127.0.0.1",
        f"--port={free_port()}",
        f"--rest_api_port={port}",
        *(
            [f"--model_config_file={config_file}"]
            if config_file is not None
            else ["--model_name=ctr", f"--model_base_path={base}"]
        ),
        "--intra_op_threads=1",
        "--log_level=warning",
        f"--enable_batching={str(batching).lower()}",
        *flags,
    ]
    environment = dict(os.environ if env is None else env)
    if checkout is not None:  # first on the path; what the environment adds (an old checkout's deps) after it
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, (str(checkout), environment.get("PYTHONPATH")))
        )
    return Server(name, cmd, port, cwd=checkout or PROJECT_ROOT, env=environment)


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) a process has used, from /proc; None where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk_point(
    server: Server, connections: int, script: Path, seconds: int, commands: list[str], warm_up: bool = True
) -> dict[str, float]:
    """A 1 s unmeasured warm-up (connection setup, lazy initialisation; `warm_up=False` skips it, for a point
    already measured once), then one measured wrk run. Adds `cpu_us`: the server process's CPU time per
    answered request (threads included, child processes not), which the machine's noise moves less than QPS."""
    if warm_up:
        warm = ["wrk", "-t1", f"-c{connections}", "-d1s", "-s", str(script), server.url]
        subprocess.run(warm, capture_output=True, check=True, timeout=60)
    wrk = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), server.url]
    if " ".join(wrk) not in commands:
        commands.append(" ".join(wrk))
    pid = server.proc.pid if server.proc is not None else None
    before = process_cpu_s(pid) if pid is not None else None
    out = subprocess.run(wrk, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    row = parse_wrk(out)
    after = process_cpu_s(pid) if pid is not None else None
    answered = re.search(r"(\d+) requests in", out)
    if before is not None and after is not None and answered and int(answered.group(1)):
        row["cpu_us"] = (after - before) / int(answered.group(1)) * 1e6
    return row


def median_row(server: str, connections: int, runs: list[dict[str, float]]) -> dict[str, Any]:
    """The run with the median QPS stands for the point; every run's QPS and p99, in round order, are kept in
    `qps_runs` and `p99_runs`."""
    ranked = sorted(runs, key=lambda r: r["qps"])
    row = {
        "server": server,
        "connections": connections,
        **ranked[len(ranked) // 2],
        "qps_runs": [r["qps"] for r in runs],
        "p99_runs": [r["p99_ms"] for r in runs],
    }
    cpu = sorted(r["cpu_us"] for r in runs if "cpu_us" in r)
    if cpu:  # its own median: the median-QPS run's CPU is one sample
        row["cpu_us"] = cpu[len(cpu) // 2]
    return row


def measure(
    servers: list[Server], plan: list[tuple[int, Path]], rounds: int, seconds: int, commands: list[str]
) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Interleave the servers: each round measures every server at every point, so a change in the
    machine's background load hits all servers alike. Returns the median row per (server, connections, script)."""
    runs: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for _ in range(rounds):
        for connections, script in plan:
            for server in servers:
                key = (server.name, connections, script.name)
                runs.setdefault(key, []).append(wrk_point(server, connections, script, seconds, commands))
    return {key: median_row(key[0], key[1], r) for key, r in runs.items()}
