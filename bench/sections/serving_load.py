"""Serving load test: our server (batching off/on) vs KServe's ModelServer vs TorchServe vs a naive FastAPI server.

Same machine, same load generator (wrk, POST through a Lua script), single-instance requests at 1, 8 and 64
connections, the servers measured in interleaved rounds; then 100-instance requests against our server, as
128-float vectors and as raw Criteo rows (the ranking rows); then what OpenTelemetry tracing costs our server
at 64 connections: off, 1% and 100% sampling (bench/sections/serving_tracing.py), interleaved in its own rounds;
then the traffic split at canary 0%, 1% and 10% and shadow scoring at 0% and 10% (bench/sections/serving_rollout.py).
Every server gets 1 worker process and 1 intra-op thread; each one's RSS (whole process group) is taken after
the load. TorchServe gets the same JSON body on its own predictions API (see `bench.peers.torchserve_server`).
Called by `make bench` (`bench.section_runner`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import procs
from bench.harness.foreign_venvs import KSERVE as KSERVE_VENV
from bench.harness.inputs import PROJECT_ROOT
from bench.harness.inputs import latest_version as latest_version_dir
from bench.harness.servers import (
    PREDICT_PATH,
    Server,
    base_path_of,
    free_port,
    measure,
    our_server,
    write_lua,
    write_wrk_script,
)
from bench.peers.torchserve_server import REQUEST_API as TS_REQUEST_API
from bench.sections import serving_rollout, serving_tracing
from ctr_contract.repository import RAW_ONNX_MODEL

# Run by path with .venv-kserve's python (importing it here would need kserve in this venv).
KSERVE_SCRIPT = PROJECT_ROOT / "bench" / "peers" / "kserve_server.py"
CONNECTIONS = (1, 8, 64)
ROUNDS_SECONDS = {"full": (3, 10), "quick": (1, 3), "tiny": (1, 2)}  # interleaved rounds, seconds per point
# Rounds of the paired comparisons (tracing, traffic split): their differences are small, so the full run takes
# 6 (3 in each order); the quick run 2 (one in each order), which keeps the section within its bound.
PAIRED_ROUNDS = {"full": 6, "quick": 2, "tiny": 1}
OURS_OFF, OURS_ON = "ours (batching off)", "ours (batching on)"
KSERVE, NAIVE = "kserve ModelServer", "naive fastapi+pytorch"
TORCHSERVE = "torchserve (TorchScript)"
RANKING_INSTANCES = 100  # one ranking call scores 100 candidate ads


class PhaseClock:
    """Wall seconds of each part of the section, in order (the report shows where the section's time goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self._last, 1)
        self._last = now


def write_raw_lua(path: Path, instances: int = 1) -> Path:
    """A wrk script that POSTs raw Criteo rows (the `raw` signature): serving/app/curl_example.py's row, with I1
    (a count) varied per row so a ranking body's candidates differ."""
    from serving.app.curl_example import CRITEO_ROW

    return write_wrk_script(path, {"instances": [{**CRITEO_ROW, "I1": i} for i in range(1, instances + 1)]})


def measure_ranking(
    servers: list[Server],
    ranking: Path,
    raw_ranking: Path | None,
    rounds: int,
    seconds: int,
    commands: list[str],
) -> dict[str, Any]:
    """Ranking requests of RANKING_INSTANCES rows at 8 connections: 128-float vectors, then raw Criteo rows,
    interleaved in the same rounds. Returns the section's ranking keys (rows/s = requests/s x rows)."""
    plan = [(8, ranking)] + ([(8, raw_ranking)] if raw_ranking is not None else [])
    rows = measure(servers, plan, rounds, seconds, commands)
    vector = {k[0]: r for k, r in rows.items() if k[2] == ranking.name}
    raw = [
        {**r, "signature": "raw", "rows_per_sec": r["qps"] * RANKING_INSTANCES}
        for k, r in rows.items()
        if raw_ranking is not None and k[2] == raw_ranking.name
    ]
    out: dict[str, Any] = {"ranking_rows": list(vector.values()), "raw_ranking_rows": raw}
    for name, key in ((OURS_ON, "batched"), (OURS_OFF, "unbatched")):
        if name in vector:
            out[f"instances_per_sec_{key}"] = vector[name]["qps"] * RANKING_INSTANCES
        out.update({f"raw_instances_per_sec_{key}": r["rows_per_sec"] for r in raw if r["server"] == name})
    return out


def raw_vs_features(
    features: dict[tuple[str, int, str], dict[str, Any]], raw: dict[tuple[str, int, str], dict[str, Any]]
) -> dict[str, float]:
    """Per server of ours: raw-signature QPS / features QPS at 64 connections (goal: >= 0.9)."""
    qps = {k[0]: r["qps"] for k, r in features.items() if k[1] == 64}
    return {k[0]: r["qps"] / qps[k[0]] for k, r in raw.items() if k[1] == 64 and qps.get(k[0])}


def torchserve_server_or_note(base: Path, workdir: Path, notes: list[str]) -> list[Server]:
    """TorchServe on the latest version's model.pt, or [] and a note saying exactly why it cannot run."""
    from bench.harness.foreign_venvs import TORCHSERVE as TS_VENV
    from bench.harness.foreign_venvs import unavailable_reason
    from bench.peers import torchserve_server

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
        mode: "full" (3 interleaved rounds of 10 s per point), "quick" (1 round of 3 s) or "tiny" (1 of 2 s);
            the tracing and traffic-split comparisons take PAIRED_ROUNDS rounds.
        repo: the model base path (`artifacts/models/ctr`) or the repository holding `ctr/`.
        workdir: scratch space for logs and wrk scripts.
        checkpoint: the training checkpoint for the naive FastAPI + PyTorch server (skipped when None).
    Returns:
        {"rows": [{server, connections, qps, p50_ms, p90_ms, p99_ms, errors, qps_runs}], "raw_rows" (the same
         for our servers on one raw Criteo row, with `features_qps` measured just before it),
         "raw_vs_features_qps_at_64",
         "instances_per_sec_batched", "instances_per_sec_unbatched", "ranking_rows", "raw_ranking_rows" (100
         raw rows per request, with `rows_per_sec`), "raw_instances_per_sec_batched", "..._unbatched",
         "tracing" (bench/sections/serving_tracing.py), "rollout" (bench/sections/serving_rollout.py),
         "commands", "notes"}.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    rounds, seconds = ROUNDS_SECONDS.get(mode, ROUNDS_SECONDS["quick"])
    paired_rounds = PAIRED_ROUNDS.get(mode, PAIRED_ROUNDS["quick"])
    phases = PhaseClock()
    base = base_path_of(repo)
    single = write_lua(workdir / "single.lua", 1)
    ranking = write_lua(workdir / f"ranking{RANKING_INSTANCES}.lua", RANKING_INSTANCES)
    raw = write_raw_lua(workdir / "raw_single.lua")
    commands: list[str] = []
    notes: list[str] = []

    servers = [our_server(OURS_OFF, base, batching=False), our_server(OURS_ON, base, batching=True)]
    try:
        if mode == "tiny" and not KSERVE_VENV.ready():
            # The tiny mode runs inside the test suite's time budget; installing KServe takes minutes.
            raise procs.StepError(f"{KSERVE_VENV.path} is absent; the quick and full modes create it")
        python = KSERVE_VENV.ensure(workdir / "kserve_install.log")
        port = free_port()
        cmd = [
            str(python),
            str(KSERVE_SCRIPT),
            f"--model_path={latest_version_dir(base) / 'model.onnx'}",
            "--model_name=ctr",
            f"--http_port={port}",
            f"--grpc_port={free_port()}",
            "--workers=1",
            "--enable_grpc=false",
            "--enable_latency_logging=false",
            "--configure_logging=false",
        ]
        servers.append(Server(KSERVE, cmd, port))
    except procs.StepError as e:
        notes.append(f"kserve skipped: {e}")
    servers += torchserve_server_or_note(base, workdir, notes)
    if checkpoint is not None:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "bench.peers.naive_fastapi_server",
            f"--checkpoint={checkpoint}",
            f"--port={port}",
        ]
        servers.append(Server(NAIVE, cmd, port))
    else:
        notes.append("naive fastapi+pytorch skipped: no checkpoint given")
    try:
        phases.lap("setup")
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
        phases.lap("start servers")
        single_rows = measure(servers, [(c, single) for c in CONNECTIONS], rounds, seconds, commands)
        phases.lap("single rows, every server")
        has_raw = (latest_version_dir(base) / RAW_ONNX_MODEL).is_file()
        raw_ranking = write_raw_lua(workdir / f"raw_ranking{RANKING_INSTANCES}.lua", RANKING_INSTANCES)
        rankings = measure_ranking(
            servers[:2], ranking, raw_ranking if has_raw else None, rounds, seconds, commands
        )
        phases.lap("ranking")
        # The `raw` signature (Criteo fields in, the FeatureSpec applied by the server) on our server, same
        # run. Each raw point is measured right after the same server's 128-float point, so the ratio
        # compares runs under the same background load.
        raw_rows, paired = {}, {}
        if has_raw:
            plan = [(c, script) for c in CONNECTIONS for script in (single, raw)]
            both = measure(servers[:2], plan, rounds, seconds, commands)
            raw_rows = {k: r for k, r in both.items() if k[2] == raw.name}
            paired = {k: r for k, r in both.items() if k[2] == single.name}
            phases.lap("raw rows")
        else:
            notes.append(
                f"raw signature not measured: the version has no {RAW_ONNX_MODEL} (exported before it)"
            )
        # Resident memory of each server's whole process group (TorchServe: JVM + worker) after the load.
        rss_mib = {s.name: procs.group_rss_mib(s.proc.pid) for s in servers if s.proc is not None}
    finally:
        procs.stop_all()
    tracing = serving_tracing.run(paired_rounds, seconds, base, workdir / "tracing", commands)
    phases.lap("tracing")
    rollout = serving_rollout.run(paired_rounds, seconds, base, workdir / "rollout", commands)
    phases.lap("traffic split")
    return {
        "rows": list(single_rows.values()),
        **rankings,
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
        "tracing": tracing,
        "rollout": rollout,
        "phase_seconds": phases.seconds,
        "commands": commands,
        "notes": notes,
    }


def main() -> None:
    """`python -m bench.sections.serving_load REPO [--mode quick] [--checkpoint C]`: print the result as JSON."""
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
