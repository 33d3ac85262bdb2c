"""Raw Criteo rows vs 128-float vectors through our server, batching off and on, optionally against another
checkout of the project (the code before a change), all interleaved in the same rounds.

    python -m bench.raw_served MODEL_BASE_PATH [--before CHECKOUT [--before_model PATH]] [--rounds 3] [--seconds 3]
    python -m bench.raw_served MODEL_BASE_PATH --profile [--before CHECKOUT] [--seconds 10]
    python -m bench.raw_served MODEL_BASE_PATH --features [--leave_one_out] [--rounds 6] [--seconds 3]
    python -m bench.raw_served MODEL_BASE_PATH --in_process [--before CHECKOUT [--before_model PATH]] [--rounds 3]
    python -m bench.raw_served MODEL_BASE_PATH --features --in_process [--before CHECKOUT] [--rounds 2]

Single rows at 8 and 64 connections (raw QPS / vector QPS, raw p99) and ranking requests of 100 rows at 8
connections (rows/s, p99): the points of issue 19's goals, with the server process's CPU time per request (the
median of the rounds), which noise moves less than QPS. One worker, `--intra_op_threads=1`; wrk
bodies from `write_lua` and `write_raw_lua` (the serving section's). Each point is the median of `--rounds`
runs.

`--profile`: instead, where each server's CPU goes under single raw rows at 64 connections, by module
(bench/harness/profile.py: py-spy for user space, perf for the kernel's share). `--features`: instead, what
each optional feature costs a single raw row, off against on at its defaults (bench/harness/feature_cost.py).
`--in_process`: instead, the Python path alone, in process (bench/guard/in_process.py): CPU µs a single raw row
at 64 fake connections, batching on, server defaults, `--rounds` runs of 5 rounds of 30,000 requests a checkout,
the checkouts taking turns. Both: every feature setup in process, for this checkout and --before's (both
serve MODEL_BASE_PATH's latest version), `--rounds` runs of 3 rounds each.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.guard import in_process
from bench.harness import feature_cost, procs
from bench.harness import profile as pyspy
from bench.harness.inputs import PROJECT_ROOT
from bench.harness.servers import Server, base_path_of, measure, our_server, write_lua, wrk_point
from bench.sections.serving_load import RANKING_INSTANCES, write_raw_lua


def report(rows: dict[tuple[str, int, str], dict[str, Any]], names: list[str]) -> str:
    """Markdown tables: single-row raw / vector QPS per server and connections, then ranking rows/s."""
    lines = [
        "| server | connections | raw QPS | vector QPS | raw / vector | raw p99 ms | vector p99 ms "
        "| server CPU µs a request: raw / vector |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        for c in (8, 64):
            raw, vec = rows[(name, c, "raw1.lua")], rows[(name, c, "vec1.lua")]
            lines.append(
                f"| {name} | {c} | {raw['qps']:,.0f} | {vec['qps']:,.0f} | {raw['qps'] / vec['qps']:.2f} "
                f"| {raw['p99_ms']:.2f} | {vec['p99_ms']:.2f} | {cpu(raw)} / {cpu(vec)} |"
            )
    lines += [
        "",
        f"| server | raw rows/s ({RANKING_INSTANCES}/request, 8 connections) | raw p99 ms | vector rows/s "
        "| vector p99 ms | server CPU µs a row: raw / vector |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        raw, vec = rows[(name, 8, "raw100.lua")], rows[(name, 8, "vec100.lua")]
        lines.append(
            f"| {name} | {raw['qps'] * RANKING_INSTANCES:,.0f} | {raw['p99_ms']:.1f} "
            f"| {vec['qps'] * RANKING_INSTANCES:,.0f} | {vec['p99_ms']:.1f} "
            f"| {cpu(raw, RANKING_INSTANCES)} / {cpu(vec, RANKING_INSTANCES)} |"
        )
    return "\n".join(lines)


# (goal, connections, script, what is compared, the target's test, the target in words)
GOALS = (
    (
        "single raw row QPS, 64 connections",
        64,
        "raw1.lua",
        "qps",
        lambda ratio, _: ratio >= 1.25,
        "≥ 1.25× before",
    ),
    (
        f"raw ranking rows/s ({RANKING_INSTANCES} rows a request, 8 connections)",
        8,
        "raw100.lua",
        "rows",
        lambda _, ours: ours >= 300_000,
        "≥ 300,000 rows/s",
    ),
    ("single raw row p99 ms, 8 connections", 8, "raw1.lua", "p99", lambda _, ours: ours <= 1.0, "≤ 1 ms"),
)


def goals(rows: dict[tuple[str, int, str], dict[str, Any]], ours: str, before: str) -> str:
    """Issue 45's goals, `ours` against `before` (batching on): each one's median (min to max) over the rounds,
    and ours over before round by round (the two measured back to back)."""
    lines = [
        "| goal | ours: median (min to max) | before | ours / before, round by round: median (min, max) "
        "| target | met |",
        "|---|---|---|---|---|---|",
    ]
    for goal, connections, script, what, met, target in GOALS:
        a, b = rows[(ours, connections, script)], rows[(before, connections, script)]
        key, scale = (
            ("p99_runs", 1) if what == "p99" else ("qps_runs", RANKING_INSTANCES if what == "rows" else 1)
        )
        ours_runs, before_runs = [v * scale for v in a[key]], [v * scale for v in b[key]]
        ratios = sorted(x / y for x, y in zip(ours_runs, before_runs, strict=True))
        median = sorted(ours_runs)[len(ours_runs) // 2]
        ratio = ratios[len(ratios) // 2]
        lines.append(
            f"| {goal} | {_spread(ours_runs)} | {_spread(before_runs)} "
            f"| {ratio:.2f} ({ratios[0]:.2f}, {ratios[-1]:.2f}) | {target} | {'yes' if met(ratio, median) else 'no'} |"
        )
    return "\n".join(lines)


def _spread(runs: list[float]) -> str:
    ranked = sorted(runs)
    digits = 2 if ranked[-1] < 100 else 0
    return f"{ranked[len(ranked) // 2]:,.{digits}f} ({ranked[0]:,.{digits}f} to {ranked[-1]:,.{digits}f})"


def cpu(row: dict[str, Any], rows_per_request: int = 1) -> str:
    """The point's median server CPU time per request (per row for ranking), µs; "-" where unmeasured."""
    return f"{row['cpu_us'] / rows_per_request:.1f}" if "cpu_us" in row else "-"


def profile(servers: list[Server], script: Path, seconds: int, work: Path, commands: list[str]) -> str:
    """Each server under single raw rows at 64 connections: its CPU per request from a plain wrk run, then,
    under the same load, perf (the kernel's share) and py-spy (the rest, by module) one after the other."""
    out: list[str] = []
    for server in servers:
        assert server.proc is not None
        cpu_us = wrk_point(server, 64, script, seconds, commands)["cpu_us"]
        load = ["wrk", "-t1", "-c64", f"-d{2 * seconds + 4}s", "-s", str(script), server.url]
        wrk = subprocess.Popen(load, stdout=subprocess.DEVNULL)
        try:
            time.sleep(1)
            kernel = pyspy.perf_kernel_share(server.proc.pid, seconds, work / "perf.data")
            stacks = pyspy.record(server.proc.pid, seconds, work / f"{len(out)}.txt")
        finally:
            wrk.wait(timeout=2 * seconds + 60)
        out += [f"### {server.name}", "", pyspy.table(pyspy.group(stacks), kernel, cpu_us), ""]
    return "\n".join(out)


def in_process_report(checkouts: dict[str, tuple[Path, Path]], runs: int) -> str:
    """Each checkout's in-process CPU a single raw row, `runs` runs of 5 rounds each, the checkouts taking
    turns (the order reversed every other run): median (min to max) and, with two, the ratio of medians."""
    figures: dict[str, list[float]] = {tag: [] for tag in checkouts}
    for run in range(runs):
        for tag, (checkout, model) in list(checkouts.items())[:: 1 if run % 2 == 0 else -1]:
            figures[tag] += in_process.measure(checkout, model, 5, 30_000, 64)
    lines = ["| checkout | CPU µs a request: median (min to max) | rounds |", "|---|---|---|"]
    for tag, values in figures.items():
        values.sort()
        name = "--before" if tag else "this checkout"
        lines.append(
            f"| {name} | {values[len(values) // 2]:.2f} ({values[0]:.2f} to {values[-1]:.2f}) | {len(values)} |"
        )
    if len(figures) == 2:
        ours, before = (sorted(v)[len(v) // 2] for v in figures.values())
        lines.append(f"\nthis checkout / --before: {ours / before:.3f} of the CPU a request")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_base_path", type=Path, help="e.g. artifacts/models/ctr")
    parser.add_argument("--before", type=Path, help="another checkout of the project, served alongside")
    parser.add_argument(
        "--before_model",
        type=Path,
        help="the model the --before checkout serves, when it needs its own export (default: the same)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="where each server's CPU goes, by module")
    parser.add_argument("--features", action="store_true", help="each feature off vs on at its defaults")
    parser.add_argument("--in_process", action="store_true", help="the Python path alone, CPU µs a raw row")
    parser.add_argument(
        "--leave_one_out", action="store_true", help="with --features: all on, and all on but each feature"
    )
    args = parser.parse_args()
    base = base_path_of(args.model_base_path.resolve())
    if args.features:
        procs.install_cleanup()
        with tempfile.TemporaryDirectory() as tmp:
            if args.in_process:  # every setup in process, for this checkout and --before's
                trees = {"this checkout": PROJECT_ROOT} | (
                    {"--before": args.before.resolve()} if args.before else {}
                )
                print(feature_cost.in_process(base, Path(tmp), args.rounds, trees, args.leave_one_out))
            else:
                print(feature_cost.run(base, Path(tmp), args.rounds, args.seconds, [], args.leave_one_out))
        return
    before_base = base_path_of(args.before_model.resolve()) if args.before_model else base
    checkouts = {"": (PROJECT_ROOT, base)} | (
        {"before, ": (args.before.resolve(), before_base)} if args.before else {}
    )
    if args.in_process:
        print(in_process_report(checkouts, args.rounds))
        return
    servers = [
        our_server(f"{tag}batching {'on' if on else 'off'}", model, on, checkout=path)
        for tag, (path, model) in checkouts.items()
        for on in (False, True)
    ]
    procs.install_cleanup()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        vec1, vec100 = write_lua(work / "vec1.lua", 1), write_lua(work / "vec100.lua", RANKING_INSTANCES)
        raw1, raw100 = (
            write_raw_lua(work / "raw1.lua", 1),
            write_raw_lua(work / "raw100.lua", RANKING_INSTANCES),
        )
        plan = [(8, vec1), (8, raw1), (64, vec1), (64, raw1), (8, vec100), (8, raw100)]
        commands: list[str] = []
        try:
            for server in servers:
                server.start(work, commands)
            if args.profile:
                print(profile(servers, raw1, args.seconds, work, commands))
                return
            rows = measure(servers, plan, args.rounds, args.seconds, commands)
        finally:
            procs.stop_all()
    print(report(rows, [s.name for s in servers]))
    if args.before:
        print("\nBatching on, ours against the --before checkout:\n")
        print(goals(rows, "batching on", "before, batching on"))


if __name__ == "__main__":
    main()
