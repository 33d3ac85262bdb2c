"""Serving load test: our server (batching off/on) vs KServe's ModelServer vs TorchServe vs a naive FastAPI server.

Same machine, same load generator (wrk, POST through a Lua script), single-instance requests at 1, 8 and 64
connections, the servers measured in interleaved rounds; then 100-instance requests against our server.
Every server gets 1 worker process and 1 intra-op thread; each one's RSS (whole process group) is taken after
the load. TorchServe gets the same JSON body on its own predictions API (see `bench.torchserve_server`).
Called by `make bench` (bench.section_runner).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import procs
from bench.inputs import PROJECT_ROOT
from bench.inputs import latest_version as latest_version_dir
from bench.torchserve_server import REQUEST_API as TS_REQUEST_API
from ctr_contract.repository import RAW_ONNX_MODEL, version_dirs

KSERVE_VENV = PROJECT_ROOT / ".venv-kserve"
CONNECTIONS = (1, 8, 64)
ROUNDS_SECONDS = {"full": (3, 10), "quick": (1, 4), "tiny": (1, 2)}  # interleaved rounds, seconds per point
OURS_OFF, OURS_ON = "ours (batching off)", "ours (batching on)"
KSERVE, NAIVE = "kserve ModelServer", "naive fastapi+pytorch"
TORCHSERVE = "torchserve (TorchScript)"
STARTUP_TIMEOUT_S = 180  # TorchServe starts a JVM, then its Python worker, on a shared 2-core machine
RANKING_INSTANCES = 100  # one ranking call scores 100 candidate ads
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


def kserve_ready() -> bool:
    """True when `.venv-kserve` exists and imports kserve and onnxruntime."""
    python = KSERVE_VENV / "bin" / "python"
    if not python.exists():
        return False
    check = [str(python), "-c", "import kserve, onnxruntime"]
    try:
        return subprocess.run(check, capture_output=True, check=False, timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        return False  # an environment whose imports hang is as unusable as a missing one


def ensure_kserve_venv(log: Path) -> Path:
    """Create `.venv-kserve` with kserve + onnxruntime on first use (minutes); return its python."""
    python = KSERVE_VENV / "bin" / "python"
    if not kserve_ready():
        procs.run_bounded(["python3", "-m", "venv", str(KSERVE_VENV)], timeout_s=120, log=log)
        procs.run_bounded(
            [str(KSERVE_VENV / "bin" / "pip"), "install", "-q", "kserve", "onnxruntime"],
            timeout_s=900,
            log=log,
        )
    return python


def write_lua(path: Path, instances: int) -> Path:
    """A wrk script that POSTs one fixed predict body with `instances` rows of 128 floats."""
    row = [round((i * 37 % 100) / 100, 2) for i in range(128)]
    body = json.dumps({"instances": [row] * instances})
    path.write_text(
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body)}\n'
    )
    return path


def write_raw_lua(path: Path) -> Path:
    """A wrk script that POSTs one raw Criteo row (the `raw` signature; serving/curl_example.py's row)."""
    from serving.curl_example import CRITEO_ROW

    body = json.dumps({"instances": [CRITEO_ROW]})
    path.write_text(
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body)}\n'
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
    """POST a valid predict request until it answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{procs.log_tail(log)}")
        try:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
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


def wrk_point(
    server: Server, connections: int, script: Path, seconds: int, commands: list[str]
) -> dict[str, float]:
    """A 1 s unmeasured warm-up (connection setup, lazy initialisation), then one measured wrk run."""
    warm = ["wrk", "-t1", f"-c{connections}", "-d1s", "-s", str(script), server.url]
    subprocess.run(warm, capture_output=True, check=True, timeout=60)
    wrk = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), server.url]
    if " ".join(wrk) not in commands:
        commands.append(" ".join(wrk))
    return parse_wrk(
        subprocess.run(wrk, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    )


def median_row(server: str, connections: int, runs: list[dict[str, float]]) -> dict[str, Any]:
    """The run with the median QPS stands for the point; every run's QPS is kept in `qps_runs`."""
    ranked = sorted(runs, key=lambda r: r["qps"])
    return {
        "server": server,
        "connections": connections,
        **ranked[len(ranked) // 2],
        "qps_runs": [r["qps"] for r in runs],
    }


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


def raw_vs_features(
    features: dict[tuple[str, int, str], dict[str, Any]], raw: dict[tuple[str, int, str], dict[str, Any]]
) -> dict[str, float]:
    """Per server of ours: raw-signature QPS / features QPS at 64 connections (goal: >= 0.7)."""
    qps = {k[0]: r["qps"] for k, r in features.items() if k[1] == 64}
    return {k[0]: r["qps"] / qps[k[0]] for k, r in raw.items() if k[1] == 64 and qps.get(k[0])}


def torchserve_server_or_note(base: Path, workdir: Path, notes: list[str]) -> list[Server]:
    """TorchServe on the latest version's model.pt, or [] and a note saying exactly why it cannot run."""
    from bench import torchserve_server
    from bench.foreign_venvs import TORCHSERVE as TS_VENV
    from bench.foreign_venvs import unavailable_reason

    reason = unavailable_reason(TS_VENV, workdir)
    if reason is None:
        try:
            ts = torchserve_server.launch(latest_version_dir(base), workdir, free_port)
            server = Server(TORCHSERVE, ts.cmd, ts.port, path=ts.path, cwd=ts.cwd, env=ts.env)
            server.versions = TS_VENV.versions
            return [server]
        except (procs.StepError, FileNotFoundError) as e:
            reason = str(e)
    notes.append(f"{TORCHSERVE} skipped: {reason}")
    return []


def run(mode: str, repo: Path, workdir: Path, checkpoint: Path | None = None) -> dict[str, Any]:
    """Run the serving comparison.

    Args:
        mode: "full" (3 interleaved rounds of 10 s per point), "quick" (1 round of 4 s) or "tiny" (1 of 2 s).
        repo: the model base path (`artifacts/models/ctr`) or the repository holding `ctr/`.
        workdir: scratch space for logs and wrk scripts.
        checkpoint: the training checkpoint for the naive FastAPI + PyTorch server (skipped when None).
    Returns:
        {"rows": [{server, connections, qps, p50_ms, p90_ms, p99_ms, errors, qps_runs}], "raw_rows" (the same
         for our servers on one raw Criteo row, with `features_qps` measured just before it),
         "raw_vs_features_qps_at_64",
         "instances_per_sec_batched", "instances_per_sec_unbatched", "commands", "notes"}.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    rounds, seconds = ROUNDS_SECONDS.get(mode, ROUNDS_SECONDS["quick"])
    base = base_path_of(repo)
    single = write_lua(workdir / "single.lua", 1)
    ranking = write_lua(workdir / f"ranking{RANKING_INSTANCES}.lua", RANKING_INSTANCES)
    raw = write_raw_lua(workdir / "raw_single.lua")
    commands: list[str] = []
    notes: list[str] = []

    def ours(name: str, batching: bool) -> Server:
        port = free_port()
        cmd = [sys.executable, "-m", "serving", "--host=127.0.0.1", f"--port={free_port()}", f"--rest_api_port={port}",
               "--model_name=ctr", f"--model_base_path={base}", "--intra_op_threads=1", "--log_level=warning",
               f"--enable_batching={str(batching).lower()}"]  # fmt: skip
        return Server(name, cmd, port)

    servers = [ours(OURS_OFF, batching=False), ours(OURS_ON, batching=True)]
    try:
        if mode == "tiny" and not kserve_ready():
            # The tiny mode runs inside the test suite's time budget; installing KServe takes minutes.
            raise procs.StepError(f"{KSERVE_VENV} is absent; the quick and full modes create it")
        python = ensure_kserve_venv(workdir / "kserve_install.log")
        port = free_port()
        cmd = [str(python), "bench/kserve_server.py", f"--model_path={latest_version_dir(base) / 'model.onnx'}",
               "--model_name=ctr", f"--http_port={port}", f"--grpc_port={free_port()}", "--workers=1",
               "--enable_grpc=false", "--enable_latency_logging=false", "--configure_logging=false"]  # fmt: skip
        servers.append(Server(KSERVE, cmd, port))
    except procs.StepError as e:
        notes.append(f"kserve skipped: {e}")
    servers += torchserve_server_or_note(base, workdir, notes)
    if checkpoint is not None:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "bench.naive_fastapi_server",
            f"--checkpoint={checkpoint}",
            f"--port={port}",
        ]
        servers.append(Server(NAIVE, cmd, port))
    else:
        notes.append("naive fastapi+pytorch skipped: no checkpoint given")
    try:
        for server in list(servers):
            try:
                server.start(workdir, commands)
            except (RuntimeError, TimeoutError) as e:
                if server.name in (OURS_OFF, OURS_ON):
                    raise
                notes.append(
                    f"{server.name} skipped: {e}"
                )  # a baseline that cannot start is reported, not fatal
                servers.remove(server)
        single_rows = measure(servers, [(c, single) for c in CONNECTIONS], rounds, seconds, commands)
        ranking_rows = measure(servers[:2], [(8, ranking)], rounds, seconds, commands)
        # The `raw` signature (Criteo fields in, FeatureSpec inside the graph) on our server, same run.
        # Each raw point is measured right after the same server's 128-float point, so the ratio compares
        # runs under the same background load.
        raw_rows, paired = {}, {}
        if (latest_version_dir(base) / RAW_ONNX_MODEL).is_file():
            plan = [(c, script) for c in CONNECTIONS for script in (single, raw)]
            both = measure(servers[:2], plan, rounds, seconds, commands)
            raw_rows = {k: r for k, r in both.items() if k[2] == raw.name}
            paired = {k: r for k, r in both.items() if k[2] == single.name}
        else:
            notes.append(
                f"raw signature not measured: the version has no {RAW_ONNX_MODEL} (exported before it)"
            )
        # Resident memory of each server's whole process group (TorchServe: JVM + worker) after the load.
        rss_mib = {s.name: procs.group_rss_mib(s.proc.pid) for s in servers if s.proc is not None}
    finally:
        procs.stop_all()
    ranked = {key[0]: row for key, row in ranking_rows.items()}
    return {
        "rows": list(single_rows.values()),
        "instances_per_sec_batched": ranked[OURS_ON]["qps"] * RANKING_INSTANCES,
        "instances_per_sec_unbatched": ranked[OURS_OFF]["qps"] * RANKING_INSTANCES,
        "ranking_rows": list(ranked.values()),
        "raw_rows": [
            {**row, "signature": "raw", "features_qps": paired[(k[0], k[1], single.name)]["qps"]}
            for k, row in raw_rows.items()
        ],
        "raw_vs_features_qps_at_64": raw_vs_features(paired, raw_rows),
        "rss_mib": rss_mib,
        "versions": {s.name: s.versions() for s in servers if s.versions is not None},
        "request_apis": {
            s.name: TS_REQUEST_API if s.name == TORCHSERVE else f"POST {PREDICT_PATH}" for s in servers
        },
        "commands": commands,
        "notes": notes,
    }


def main() -> None:
    """`python -m bench.serving_load REPO [--mode quick] [--checkpoint C]`: print the result as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--mode", default="quick", choices=sorted(ROUNDS_SECONDS))
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--workdir", type=Path, default=PROJECT_ROOT / "bench" / "results" / "serving_load")
    args = parser.parse_args()
    procs.install_cleanup()
    print(json.dumps(run(args.mode, args.repo, args.workdir, args.checkpoint), indent=2))


if __name__ == "__main__":
    main()
