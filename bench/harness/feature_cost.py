"""What each optional feature costs a single raw row: every feature off against each one at its defaults, and
against all of them together, paired round by round in one run (`python -m bench.raw_served --features`).

One worker, batching on, `--intra_op_threads=1`, 64 connections; every server on the same repository (the
model's latest version copied as versions 1 and 2; without the split, the latest is served). The setups:
    all off         one version, --drift_window=0, --fallback_error_rate=0, --model_statistics=false, no
                    tracing, no request log
    statistics      Triton's statistics at their default (--model_statistics=true)
    drift           --drift_window at its default (10,000 rows)
    fallback        the circuit breakers at their defaults (--fallback_error_rate=0.5)
    tracing 1%      --tracing_config with sample_ratio 0.01, spans exported to a local OTLP sink
    canary 10%      --model_version_policy=specific:1,2, --version_labels=stable=1,canary=2, --canary_percent=10
    request log 1%  --request_log_dir with --request_log_sample_rate=0.01
    drift and canary 10%   the two together: drift then watches two versions taking turns
    all on          every one of the above together
    all off, gzip offered   the client sends `Accept-Encoding: gzip` (a one-row answer is below the compression
                    threshold, so what is paid is the header's handling)
With `--leave_one_out`: all off, all on, and "all but X" for each feature X (what X costs among the others).
`--in_process`: the same setups through bench/guard/in_process.py (the Python path alone, no wrk).
The goal: "all on" loses at most 5% QPS against "all off".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import median
from typing import Any

from bench.guard import in_process as in_process_run
from bench.harness import procs
from bench.harness.servers import Server, median_row, our_server, wrk_point
from bench.sections.serving_load import write_raw_lua
from bench.sections.serving_rollout import two_versions
from bench.sections.serving_tracing import SpanSink, paired

CONNECTIONS = 64
ALL_OFF, ALL_ON, GZIP = "all off", "all on", "gzip offered"
DRIFT_AND_CANARY = "drift and canary 10%"
OFF_FLAGS = ("--drift_window=0", "--fallback_error_rate=0", "--model_statistics=false")
CANARY_FLAGS = (
    "--model_version_policy=specific:1,2",
    "--version_labels=stable=1,canary=2",
    "--canary_percent=10",
)


def feature_flags(tracing: Path, logs: Path) -> dict[str, tuple[str, ...]]:
    """Each feature's flags at its defaults (on where it is off by default); `tracing`: the tracing config
    file; `logs`: the request log's folder."""
    return {
        "statistics": ("--model_statistics=true",),
        "drift": ("--drift_window=10000",),
        "fallback": ("--fallback_error_rate=0.5",),
        "tracing 1%": (f"--tracing_config={tracing}",),
        "canary 10%": CANARY_FLAGS,
        "request log 1%": (f"--request_log_dir={logs}", "--request_log_sample_rate=0.01"),
    }


def setups(
    base: Path, workdir: Path, sink_port: int, leave_one_out: bool = False
) -> tuple[Path, dict[str, list[str]]]:
    """The repository every setup serves, and each setup's flags: all off, each feature alone, drift with the
    canary, all on; with `leave_one_out`, all off, all on and all on but each feature instead."""
    workdir.mkdir(parents=True, exist_ok=True)
    tracing = workdir / "tracing_1.json"
    tracing.write_text(
        json.dumps({"endpoint": f"http://127.0.0.1:{sink_port}", "protocol": "grpc", "sample_ratio": 0.01})
    )

    def flags(turned_on: tuple[str, ...]) -> list[str]:
        """`turned_on` replaces the off flag of the same name."""
        names = {flag.split("=")[0] for flag in turned_on}
        return [f for f in OFF_FLAGS if f.split("=")[0] not in names] + list(turned_on)

    logs = workdir / "request_logs"
    alone = feature_flags(tracing, logs / "alone")
    together = tuple(f for fs in feature_flags(tracing, logs / "together").values() for f in fs)
    pair = alone["drift"] + alone["canary 10%"]  # drift watches a split's two versions taking turns
    repo = two_versions(base, workdir / "repo")
    if leave_one_out:  # what each feature costs among the others
        but = feature_flags(tracing, logs / "but")
        return repo, {ALL_OFF: flags(()), ALL_ON: flags(together)} | {
            f"all but {left}": flags(tuple(f for name, fs in but.items() if name != left for f in fs))
            for left in but
        }
    named = {ALL_OFF: flags(())} | {name: flags(on) for name, on in alone.items()}
    return repo, named | {DRIFT_AND_CANARY: flags(pair), ALL_ON: flags(together)}


def servers(base: Path, workdir: Path, sink_port: int, leave_one_out: bool = False) -> list[Server]:
    """The setups' servers (not started)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # "off" is really off
    repo, named = setups(base, workdir, sink_port, leave_one_out)
    return [our_server(name, repo, batching=True, flags=flags, env=env) for name, flags in named.items()]


def in_process(
    base: Path, workdir: Path, rounds: int, checkouts: dict[str, Path], leave_one_out: bool = False
) -> str:
    """Every setup of each checkout in process (bench/guard/in_process.py: CPU µs a single raw row, no kernel,
    no wrk), a child process a setup, `rounds` runs of 3 rounds of 30,000 requests, the setups and checkouts
    taking turns (the order reversed every other run): each setup's median and its change against all off."""
    sink = SpanSink()
    figures: dict[tuple[str, str], list[float]] = {}
    try:
        repo, named = setups(base, workdir, sink.port, leave_one_out)
        plan = [(tag, name) for tag in checkouts for name in named]
        for run in range(rounds):
            for tag, name in plan if run % 2 == 0 else plan[::-1]:
                found = in_process_run.measure(
                    checkouts[tag], repo, 3, 30_000, CONNECTIONS, tuple(named[name])
                )
                figures.setdefault((tag, name), []).extend(found)
    finally:
        sink.stop()
    lines = ["| checkout | setup | CPU µs a request: median (min to max) | vs all off |", "|---|---|---|---|"]
    for (tag, name), values in figures.items():
        off, mid = median(figures[(tag, ALL_OFF)]), median(values)
        lines.append(
            f"| {tag} | {name} | {mid:.2f} ({min(values):.2f} to {max(values):.2f}) | {mid - off:+.2f} µs |"
        )
    return "\n".join(lines)


def run(
    base: Path, workdir: Path, rounds: int, seconds: int, commands: list[str], leave_one_out: bool = False
) -> str:
    """Measure every setup in alternating interleaved rounds; returns the markdown table."""
    sink = SpanSink()
    plain = write_raw_lua(workdir / "raw1.lua", 1)
    gzip = write_raw_lua(workdir / "raw1_gzip.lua", 1)
    gzip.write_text(gzip.read_text() + 'wrk.headers["Accept-Encoding"] = "gzip"\n')
    setups = servers(base, workdir, sink.port, leave_one_out)
    # (setup name, server, script): every setup on plain requests, then "all off" with gzip offered.
    plan = [(server.name, server, plain) for server in setups] + [(f"{ALL_OFF}, {GZIP}", setups[0], gzip)]
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        for server in setups:
            server.start(workdir, commands)
        for round_ in range(rounds):  # the order reversed every other round (bench.sections.serving_tracing)
            for name, server, script in plan if round_ % 2 == 0 else plan[::-1]:
                runs.setdefault(name, []).append(wrk_point(server, CONNECTIONS, script, seconds, commands))
    finally:
        procs.stop_all()
        sink.stop()
    return table(runs)


def table(runs: dict[str, list[dict[str, float]]]) -> str:
    """Each setup's median QPS and CPU a request, and its paired change against "all off" (median, min, max
    of the rounds)."""
    off = runs[ALL_OFF]
    lines = [
        "| setup | QPS | server CPU µs a request | QPS vs all off: median (min, max) | CPU vs all off |",
        "|---|---|---|---|---|",
    ]
    for name, these in runs.items():
        row = median_row(name, CONNECTIONS, these)
        qps, cpu = paired(these, off, "qps"), paired(these, off, "cpu_us")
        lines.append(
            f"| {name} | {row['qps']:,.0f} | {row.get('cpu_us', float('nan')):.1f} "
            f"| {_pct(qps)} | {_pct(cpu)} |"
        )
    return "\n".join(lines)


def _pct(p: dict[str, Any]) -> str:
    return f"{p['median']:+.1%} ({p['min']:+.1%}, {p['max']:+.1%})"
