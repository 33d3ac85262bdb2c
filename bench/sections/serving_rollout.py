"""What the traffic split and shadow scoring cost the server: canary 0%, 1% and 10%; shadow 0% and 10%.

Our server (batching on, 1 worker, 1 intra-op thread) on a repository of two versions (the model's latest
version copied as versions 1 and 2), each server with its own `--model_config_file`: labels `stable` = 1 and
`canary` = 2 (or `shadow` = 2), `specific` policy {1, 2}, and the `# ctr-traffic:` line with the share
(ctr_contract/traffic.py). wrk sends no request id, so each request's choice is the server's random draw.
Measured in interleaved rounds (the servers' order reversed every other round), one 128-float instance a
request: the canary servers at 64 connections (QPS and server CPU a request), and shadow 0% against 10% at 8
connections (the client's p99). Each figure is also given paired: each round's ratio to the 0% server of the same
round (the two measured back to back), its median and min-max, as bench/sections/serving_tracing.py does.
After the load, each server's metrics page gives the share each version answered and the shadow jobs scored
and dropped. The serving section of `make bench` (bench/sections/serving_load.py, key `rollout`) runs it;
standalone:
    python -m bench.sections.serving_rollout BASE_PATH [--rounds 6] [--seconds 4]
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import procs
from bench.harness.inputs import PROJECT_ROOT
from bench.harness.inputs import latest_version as latest_version_dir
from bench.harness.servers import Server, median_row, our_server, write_lua, wrk_point
from bench.sections.serving_tracing import paired

IN_PROCESS_PREDICTS = 4000  # predicts per setup and rep in the in-process measurement
DEFAULT_ROUNDS = 6  # as the tracing comparison: medians of 6 interleaved rounds (3 in each order)
CANARY_CONNECTIONS, SHADOW_CONNECTIONS = 64, 8
CANARY_0, CANARY_1, CANARY_10 = "canary 0%", "canary 1%", "canary 10%"
SHADOW_10 = "shadow 10%"
SETUPS = {  # server -> (the second version's label, canary percent, shadow percent)
    CANARY_0: ("canary", 0.0, 0.0),
    CANARY_1: ("canary", 1.0, 0.0),
    CANARY_10: ("canary", 10.0, 0.0),
    SHADOW_10: ("shadow", 0.0, 10.0),
}
# (connections, servers measured at it); the first server of each is the one the others are paired with.
PLAN = ((CANARY_CONNECTIONS, (CANARY_0, CANARY_1, CANARY_10)), (SHADOW_CONNECTIONS, (CANARY_0, SHADOW_10)))


def two_versions(base: Path, repo: Path) -> Path:
    """`repo`/ctr/1 and /2: copies of `base`'s latest version (a server's split cost does not depend on the
    weights). Returns the base path."""
    source = latest_version_dir(base)
    target = repo / "ctr"
    shutil.rmtree(target, ignore_errors=True)
    for version in (1, 2):
        shutil.copytree(source, target / str(version))
    return target


def model_config(base: Path, label: str, canary: float, shadow: float) -> str:
    """The ModelServerConfig text: versions 1 and 2, `stable` = 1, `label` = 2, and the ctr-traffic line."""
    return (
        f"# ctr-traffic: model=ctr canary_percent={canary:g} shadow_percent={shadow:g}\n"
        "model_config_list {\n  config {\n"
        f'    name: "ctr"\n    base_path: "{base}"\n    model_platform: "tensorflow"\n'
        "    model_version_policy { specific { versions: 1 versions: 2 } }\n"
        f'    version_labels {{ key: "stable" value: 1 }}\n    version_labels {{ key: "{label}" value: 2 }}\n'
        "  }\n}\n"
    )


def _server(name: str, base: Path, workdir: Path) -> Server:
    label, canary, shadow = SETUPS[name]
    config = workdir / f"{re.sub(r'[^a-z0-9]+', '_', name)}.config"
    config.write_text(model_config(base, label, canary, shadow))
    return our_server(name, base, batching=True, config_file=config)


def served_shares(server: Server) -> dict[str, Any]:
    """Requests answered by each version (Triton's statistics, /v2/models/ctr/stats), the shadow jobs scored
    and dropped, and the rows per model call (the metrics page), after the load."""
    root = server.url.split("/v1/")[0]
    with urllib.request.urlopen(root + "/v2/models/ctr/stats", timeout=10) as response:
        stats = json.loads(response.read())["model_stats"]
    with urllib.request.urlopen(root + "/monitoring/prometheus/metrics", timeout=10) as response:
        text = response.read().decode()
    answered = {s["version"]: float(s["inference_stats"]["success"]["count"]) for s in stats}
    total = sum(answered.values())
    scored = sum(map(float, re.findall(r"ctr_serving_shadow_scored_total\{[^}]*\} (\S+)", text)))
    dropped = re.findall(r'ctr_serving_shadow_dropped_total\{[^}]*reason="(\w+)"\} (\S+)', text)
    rows = re.search(r'ctr_serving_batch_size_sum\{model_name="ctr"\} (\S+)', text)
    calls = re.search(r'ctr_serving_batch_size_count\{model_name="ctr"\} (\S+)', text)
    return {
        "answered": answered,
        "share_version_2": answered.get("2", 0.0) / total if total else None,
        "shadow_scored": scored,
        "shadow_dropped": {reason: float(value) for reason, value in dropped},
        # Rows per model call, every version's batches together (the split gives each version its own batcher).
        "rows_per_batch": float(rows.group(1)) / float(calls.group(1)) if rows and calls else None,
    }


def in_process_cost(base: Path, reps: int = 5, predicts: int = IN_PROCESS_PREDICTS) -> dict[str, Any]:
    """The same setups without HTTP: CPU time per predict through the Predictor (the real ModelManager and
    ONNX Runtime on `base`'s versions 1 and 2, direct runners, 8 concurrent callers each yielding between
    predicts, client ids "r<k>-<i>" hashed by the split), shadow work included (measured until its queue is
    empty). The setups are interleaved `reps` times (order reversed every other time). Returns {"cpu_us":
    {setup: median/min/max}, "vs_canary_0_us": {setup: each rep's difference to canary 0%, median/min/max}}."""
    return asyncio.run(_in_process(base, reps, predicts))


async def _in_process(base: Path, reps: int, predicts: int) -> dict[str, Any]:
    from ctr_contract.traffic import TrafficSplit
    from serving.dataplane.predictor import Predictor
    from serving.dataplane.validation import Limits
    from serving.observability.metrics import ServingMetrics
    from serving.repository.manager import ModelManager
    from serving.repository.policy import VersionPolicy
    from serving.requests import DecodedRequest
    from serving.routing.router import Router
    from serving.signatures import DEFAULT_SIGNATURE, Signature

    metrics = ServingMetrics()
    metrics.start_at_zero("ctr")
    with ThreadPoolExecutor(1) as disk:
        router = Router("ctr", {}, metrics)
        policy = VersionPolicy("specific", versions=(1, 2))
        manager = ModelManager("ctr", base, "onnx", 1, policy, metrics, disk, router)
        await manager.poll_once()
        predictor = Predictor(manager, router, Limits(max_instances=1024, allow_nonfinite=False), metrics)
        width = manager.loaded[1].backend.signature.width
        x = np.full((1, width), 0.5, np.float32)

        async def decode(sig: Signature) -> DecodedRequest:
            return DecodedRequest(DEFAULT_SIGNATURE, x)

        async def caller(k: int, n: int, tag: str) -> None:
            for i in range(n):
                await predictor.predict("ctr", None, None, decode, "REST", f"r{k}-{tag}-{i}")
                await asyncio.sleep(0)

        async def measure(name: str, tag: str, n: int) -> float:
            label, canary, shadow = SETUPS[name]
            router.configure({"stable": 1, label: 2}, TrafficSplit(canary, shadow))
            started = time.process_time()
            await asyncio.gather(*(caller(k, n // 8, tag) for k in range(8)))
            while predictor.shadow.queued:
                await asyncio.sleep(0.005)
            return (time.process_time() - started) / (n // 8 * 8) * 1e6

        for name in SETUPS:  # warm-up: every setup once, unmeasured
            await measure(name, "warm", predicts // 4)
        cpu: dict[str, list[float]] = {name: [] for name in SETUPS}
        for rep in range(reps):
            for name in list(SETUPS) if rep % 2 == 0 else list(SETUPS)[::-1]:
                cpu[name].append(await measure(name, str(rep), predicts))
        predictor.shadow.stop()
        for servable in manager.loaded.values():
            servable.close()

    def spread(values: list[float]) -> dict[str, float]:
        ranked = sorted(values)
        return {"median": ranked[len(ranked) // 2], "min": ranked[0], "max": ranked[-1]}

    return {
        "predicts": predicts,
        "reps": reps,
        "cpu_us": {name: spread(v) for name, v in cpu.items()},
        "vs_canary_0_us": {
            name: spread([a - b for a, b in zip(v, cpu[CANARY_0], strict=True)])
            for name, v in cpu.items()
            if name != CANARY_0
        },
    }


def run(rounds: int, seconds: int, base: Path, workdir: Path, commands: list[str]) -> dict[str, Any]:
    """Measure; returns {"rows": [...] (median rows per server and connections), "paired": {connections:
    {server: {"qps", "cpu_us", "p99_ms"}}} (each against the 0% server round by round: median, min, max,
    rounds), "shadow_p99_ratio_at_8" (the paired median, minus 1), "served": {server: served_shares},
    "in_process": in_process_cost}."""
    workdir.mkdir(parents=True, exist_ok=True)
    repo_base = two_versions(base, workdir / "repo")
    servers = {name: _server(name, repo_base, workdir) for name in SETUPS}
    script = write_lua(workdir / "single.lua", 1)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for server in servers.values():
            server.start(workdir, commands)
        for round_ in range(rounds):
            for connections, names in PLAN:
                for name in names if round_ % 2 == 0 else names[::-1]:
                    point = wrk_point(servers[name], connections, script, seconds, commands)
                    runs.setdefault((name, connections), []).append(point)
        served = {name: served_shares(server) for name, server in servers.items()}
    finally:
        procs.stop_all()
    rows = [median_row(name, connections, r) for (name, connections), r in runs.items()]
    out: dict[str, Any] = {"rows": rows, "paired": {}, "served": served}
    for connections, names in PLAN:
        against = runs[(names[0], connections)]
        out["paired"][str(connections)] = {
            name: {f: paired(runs[(name, connections)], against, f) for f in ("qps", "cpu_us", "p99_ms")}
            for name in names[1:]
        }
    out["shadow_p99_ratio_at_8"] = out["paired"][str(SHADOW_CONNECTIONS)][SHADOW_10]["p99_ms"]["median"]
    out["in_process"] = in_process_cost(repo_base, reps=max(3, min(rounds, 9)))
    return out


def rollout_lines(result: dict[str, Any]) -> list[str]:
    """The report's table: each server's median QPS, p99 and CPU, and its paired ratios against 0%."""
    if not result.get("rows"):
        return []
    head = "| server | connections | QPS | p99 ms | CPU µs / request | paired QPS | paired p99 | paired CPU |"
    lines = [
        "Traffic split and shadow scoring (paired: median of the rounds' ratios to canary 0%, min-max):",
        "",
    ]
    lines += [head, "|---|---:|---:|---:|---:|---|---|---|"]
    for row in result["rows"]:
        pair = result.get("paired", {}).get(str(row["connections"]), {}).get(row["server"], {})
        cells = [_ratio(pair.get(f)) for f in ("qps", "p99_ms", "cpu_us")]
        cpu = row.get("cpu_us")
        lines.append(
            f"| {row['server']} | {row['connections']} | {row['qps']:,.0f} | {row['p99_ms']:.2f} | "
            f"{'' if cpu is None else f'{cpu:.1f}'} | {' | '.join(cells)} |"
        )
    extra = in_process_lines(result)
    return lines + (["", *extra] if extra else [])


def in_process_lines(result: dict[str, Any]) -> list[str]:
    """One line per setup: its CPU a predict without HTTP, and the difference to canary 0%."""
    figures = result.get("in_process") or {}
    lines = []
    for name, cpu in figures.get("cpu_us", {}).items():
        diff = figures.get("vs_canary_0_us", {}).get(name)
        against = (
            ""
            if diff is None
            else f", {diff['median']:+.2f} µs vs canary 0% ({diff['min']:+.2f} to {diff['max']:+.2f})"
        )
        lines.append(
            f"- {name}: {cpu['median']:.2f} µs CPU a predict ({cpu['min']:.2f}-{cpu['max']:.2f}){against}"
        )
    if lines:
        lines = ["The same setups without HTTP (the predict path alone, 8 concurrent callers):", "", *lines]
    return lines


def _ratio(figure: dict[str, Any] | None) -> str:
    if not figure:
        return ""
    return f"{figure['median']:+.1%} ({figure['min']:+.1%} to {figure['max']:+.1%})"


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the model base path (versions inside)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="interleaved rounds (default: 6)")
    parser.add_argument("--seconds", type=int, default=4, help="seconds of wrk per point (default: 4)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=PROJECT_ROOT / "bench" / "results" / "serving_rollout",
        help="logs, configs, the two-version repository (default: bench/results/serving_rollout)",
    )
    args = parser.parse_args()
    procs.install_cleanup()
    commands: list[str] = []
    result = run(args.rounds, args.seconds, args.base.resolve(), args.workdir, commands)
    print(json.dumps({**result, "commands": commands}, indent=2))
    print("\n".join(rollout_lines(result)), file=sys.stderr)


if __name__ == "__main__":
    main()
