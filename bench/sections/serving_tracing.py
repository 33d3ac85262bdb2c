"""What OpenTelemetry tracing costs the server: QPS with tracing off, at 1% sampling and at 100%.

Our server (batching on, 1 worker, 1 intra-op thread) three times over, measured in interleaved rounds with
wrk at 64 connections on one 128-float instance and on one raw Criteo row: tracing off (no flag, no OTEL_*
variable), `sample_ratio` 0.01 and 1.0. Every span goes to an OTLP receiver on 127.0.0.1 (OTLP's
TraceService from opentelemetry-proto, in this process: it counts the spans it is sent). `before`, when
given, is the same server from another checkout (the code before tracing), so "off" is compared with it.
The serving section of `make bench` (bench/sections/serving_load.py) runs it; standalone:
    python -m bench.sections.serving_tracing BASE_PATH [--rounds 6] [--seconds 4] [--before DIR]
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.harness import procs
from bench.harness.inputs import PROJECT_ROOT
from bench.harness.servers import Server, median_row, our_server, write_lua, write_wrk_script, wrk_point

CONNECTIONS = 64
DEFAULT_ROUNDS = 6  # medians of 6 interleaved rounds (3 in each order): the differences sought are small
OFF, ONE_PCT, ALL = "tracing off", "tracing 1%", "tracing 100%"
BEFORE = "before tracing"


class SpanSink:
    """An OTLP/gRPC trace receiver that only counts what it gets."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        sink = self
        self.spans, self._lock = 0, threading.Lock()

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                with sink._lock:
                    sink.spans += n
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


def _server(name: str, base: Path, tracing: Path | None, checkout: Path | None = None) -> Server:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # "off" is really off
    flags = [f"--tracing_config={tracing}"] if tracing is not None else []
    return our_server(name, base, batching=True, flags=flags, checkout=checkout, env=env)


def _alternating(
    servers: list[Server], scripts: list[Path], rounds: int, seconds: int, commands: list[str]
) -> dict[tuple[str, int, str], list[dict[str, float]]]:
    """Interleaved rounds as bench.harness.servers.measure runs them, the servers' order reversed every other
    round: the server measured first in a round did better often enough to matter at these differences.
    Returns every round's run per (server, connections, script), in round order."""
    runs: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for round_ in range(rounds):
        for script in scripts:
            for server in servers if round_ % 2 == 0 else servers[::-1]:
                key = (server.name, CONNECTIONS, script.name)
                runs.setdefault(key, []).append(wrk_point(server, CONNECTIONS, script, seconds, commands))
    return runs


def paired(runs: list[dict[str, float]], against: list[dict[str, float]], field: str) -> dict[str, Any]:
    """`field` of each round's run over the same round's run of `against` (minus 1): the two were measured
    back to back, so a round's load level cancels out of the ratio. Median, min, max and every round's."""
    ratios = sorted(r[field] / a[field] - 1 for r, a in zip(runs, against, strict=True) if a.get(field))
    every = [round(r[field] / a[field] - 1, 4) for r, a in zip(runs, against, strict=True) if a.get(field)]
    return {"median": ratios[len(ratios) // 2], "min": ratios[0], "max": ratios[-1], "rounds": every}


def run(
    rounds: int, seconds: int, base: Path, workdir: Path, commands: list[str], before: Path | None = None
) -> dict[str, Any]:
    """Measure; returns {"rows": [...], "qps_loss_1pct_*", "qps_loss_100pct_*", "cpu_us_*", "off_vs_before_*",
    "paired_vs_off_*" (each server against "off" round by round: QPS and CPU a request, median min max),
    "spans_received"} (* = features, raw)."""
    from serving.app.curl_example import CRITEO_ROW

    workdir.mkdir(parents=True, exist_ok=True)
    sink = SpanSink()
    configs = {}
    for name, ratio in ((ONE_PCT, 0.01), (ALL, 1.0)):
        configs[name] = workdir / f"tracing_{int(ratio * 100)}.json"
        configs[name].write_text(
            json.dumps(
                {"endpoint": f"http://127.0.0.1:{sink.port}", "protocol": "grpc", "sample_ratio": ratio}
            )
        )
    servers = [_server(OFF, base, None)]
    if before is not None:
        servers.insert(0, _server(BEFORE, base, None, checkout=before))
    servers += [_server(name, base, path) for name, path in configs.items()]
    raw = write_wrk_script(workdir / "raw_single.lua", {"instances": [CRITEO_ROW]})
    scripts = [write_lua(workdir / "single.lua", 1), raw]
    try:
        for server in servers:
            server.start(workdir, commands)
        runs = _alternating(servers, scripts, rounds, seconds, commands)
    finally:
        procs.stop_all()
        sink.stop()
    rows = {key: median_row(key[0], key[1], r) for key, r in runs.items()}
    out: dict[str, Any] = {"rows": list(rows.values()), "spans_received": sink.spans}
    for script in scripts:
        qps = {k[0]: r["qps"] for k, r in rows.items() if k[2] == script.name}
        kind = "raw" if script.name.startswith("raw") else "features"
        out[f"cpu_us_{kind}"] = {k[0]: r.get("cpu_us") for k, r in rows.items() if k[2] == script.name}
        out[f"qps_loss_1pct_{kind}"] = 1 - qps[ONE_PCT] / qps[OFF]
        out[f"qps_loss_100pct_{kind}"] = 1 - qps[ALL] / qps[OFF]
        if BEFORE in qps:
            out[f"off_vs_before_{kind}"] = qps[OFF] / qps[BEFORE] - 1
        # The same, round by round (each server against "off" of the same round): steadier than the medians'
        # ratio on a machine whose load moves between rounds.
        off_runs = runs[(OFF, CONNECTIONS, script.name)]
        for name in [n for n in qps if n != OFF]:
            these = runs[(name, CONNECTIONS, script.name)]
            out.setdefault(f"paired_vs_off_{kind}", {})[name] = {
                "qps": paired(these, off_runs, "qps"),
                "cpu_us": paired(these, off_runs, "cpu_us"),
            }
    return out


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the model base path (versions inside)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="interleaved rounds (default: 6)",
    )
    parser.add_argument("--seconds", type=int, default=4, help="seconds of wrk per point (default: 4)")
    parser.add_argument(
        "--before", type=Path, default=None, help="a checkout of the code before tracing (default: none)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=PROJECT_ROOT / "bench" / "results" / "serving_tracing",
        help="logs and wrk scripts (default: bench/results/serving_tracing)",
    )
    args = parser.parse_args()
    procs.install_cleanup()
    commands: list[str] = []
    result = run(args.rounds, args.seconds, args.base.resolve(), args.workdir, commands, args.before)
    print(json.dumps({**result, "commands": commands}, indent=2))


if __name__ == "__main__":
    main()
