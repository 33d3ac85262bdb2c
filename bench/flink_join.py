"""The click join's two engines on the same input: joined rows/s and peak memory (docs/flink-join.md).

    python -m bench.flink_join --requests 1000000 --workdir artifacts/flink_join_bench

The input: `--requests` logged requests at `--rate` a second of event time (one instance each, a small raw row,
its score), spread over 4 serving pods' log files that roll over every 60 s, and their clicks (`--ctr` of the
instances, within the attribution window, a few late, duplicated or before their request). The intervals are
`--interval-s` long, the window `--window-s`.

- embedded: `join_interval` for every interval, one after another, in one process (as the online trainer runs it);
- flink p=1, p=2: the Flink job (pipelines/clicks/flink/) over the same folders, bounded, in a local MiniCluster
  at parallelism 1 and 2, every interval in one job.

Each engine runs in its own process; its wall time counts everything (for Flink the MiniCluster's start too),
peak memory is the largest sum of the resident set sizes of its process tree, sampled every 0.2 s. Every engine's
reports must agree (rows, positives, counts) or the run fails. Results: WORKDIR/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.clicks.flink.config import JobConfig
from pipelines.clicks.flink.engine import flink_python, read_report, start_job

ROW = {"I1": 3, "I5": 1382, "I13": 7, "C1": "68fd1e64", "C9": "a73ee510", "C26": "b28479f6"}
T0 = 1_800_000_000.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_input(root: Path, requests: int, rate: float, window_s: float, ctr: float, seed: int = 1) -> None:
    """ROOT/logs (4 pods, a file a minute each) and ROOT/clicks (a file a minute)."""
    rng = random.Random(seed)
    logs, clicks = root / "logs", root / "clicks"
    open_files: dict[str, Any] = {}
    pending: list[tuple[float, str]] = []

    def write(name: str, line: str) -> None:
        if name not in open_files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            open_files[name] = (root / name).open("w")
        open_files[name].write(line + "\n")

    for k in range(requests):
        t = T0 + k / rate
        rid = f"b{k:08d}"
        pod = k % 4
        line = json.dumps(
            {
                "request_id": rid,
                "time": _iso(t),
                "model": {"name": "ctr", "version": 1, "label": "stable"},
                "canary": False,
                "shadow": False,
                "inputs": {"instances": [dict(ROW, I1=k % 100)]},
                "outputs": [[round(rng.random(), 4)]],
            }
        )
        write(f"logs/pod-{pod}/requests-{pod}-{int((t - T0) // 60):05d}.jsonl", line)
        u = rng.random()
        if u < ctr:
            dt = rng.uniform(0, window_s) if u < ctr * 0.9 else rng.choice((window_s + 5, -0.5))
            pending.append((t + dt, json.dumps({"request_id": rid, "instance": 0, "time": t + dt})))
            if u < ctr * 0.05:
                pending.append(
                    (t + dt + 1, json.dumps({"request_id": rid, "instance": 0, "time": t + dt + 1}))
                )
    for t, line in sorted(pending):
        write(f"clicks/clicks-{int((t - T0) // 60):05d}.jsonl", line)
    for f in open_files.values():
        f.close()
    for folder in (logs, clicks):  # mtimes as a live writer leaves them: the last line's time
        for p in folder.rglob("*.jsonl"):
            minute = int(p.stem.rsplit("-", 1)[1])
            os.utime(p, (T0 + 60 * (minute + 1), T0 + 60 * (minute + 1)))


class Peak:
    """The largest summed RSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree_rss(self) -> int:
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(d.name))
                rss[int(d.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, IndexError, ValueError):
                continue
        total, todo = 0, [self.pid]
        while todo:
            p = todo.pop()
            total += rss.get(p, 0)
            todo += children.get(p, [])
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._tree_rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _intervals(args: argparse.Namespace) -> list[list[float]]:
    n = int(args.requests / args.rate // args.interval_s) + 1
    first = int(T0 // args.interval_s)
    return [[first + j, (first + j) * args.interval_s, (first + j + 1) * args.interval_s] for j in range(n)]


def run_embedded(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from pipelines.clicks.join import join_interval\n"
        "a = json.loads(sys.argv[1])\n"
        "out = [join_interval(Path(a['logs']), Path(a['clicks']), Path(a['out']), int(n), s, e, a['window_s'], 0.2)"
        ".to_json() for n, s, e in a['intervals']]\n"
        "Path(a['reports']).write_text(json.dumps(out))\n"
    )
    spec = {
        "logs": str(work / "logs"),
        "clicks": str(work / "clicks"),
        "out": str(work / "out-embedded"),
        "window_s": args.window_s,
        "intervals": _intervals(args),
        "reports": str(work / "embedded-reports.json"),
    }
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(spec)], cwd=Path(__file__).resolve().parents[1]
    )
    peak = Peak(proc.pid)
    assert proc.wait() == 0, "the embedded join failed"
    seconds, rss = time.perf_counter() - t0, peak.stop()
    reports = [json.loads(r) for r in json.loads((work / "embedded-reports.json").read_text())]
    return _result("embedded", seconds, rss, reports)


def run_flink(args: argparse.Namespace, work: Path, parallelism: int) -> dict[str, Any]:
    ivs = _intervals(args)
    cfg = JobConfig(
        requests={"connector": "filesystem", "path": str(work / "logs")},
        clicks={"connector": "filesystem", "path": str(work / "clicks")},
        out=str(work / f"out-flink-p{parallelism}"),
        reports=str(work / f"reports-p{parallelism}"),
        window_s=args.window_s,
        holdout=0.2,
        interval_s=args.interval_s,
        explicit=ivs,
        parallelism=parallelism,
        settings={"taskmanager.memory.process.size": args.flink_memory} if args.flink_memory else {},
    )
    t0 = time.perf_counter()
    proc = start_job(cfg, work / f"job-p{parallelism}")
    peak = Peak(proc.pid)
    rc = proc.wait()
    seconds, rss = time.perf_counter() - t0, peak.stop()
    assert rc == 0, f"the Flink job failed: {work / f'job-p{parallelism}' / 'job.log'}"
    reports = [read_report(Path(cfg.reports), int(n), s, e).__dict__ for n, s, e in ivs]
    return _result(f"flink p={parallelism}", seconds, rss, reports)


def _result(engine: str, seconds: float, rss: int, reports: list[dict[str, Any]]) -> dict[str, Any]:
    rows = sum(r["rows"] for r in reports)
    summary = [(r["interval"], r["rows"], r["positives"], r["holdout_rows"], r["counts"]) for r in reports]
    return {
        "engine": engine,
        "seconds": round(seconds, 1),
        "joined_rows": rows,
        "rows_per_s": round(rows / seconds),
        "peak_rss_mib": round(rss / 2**20),
        "_summary": summary,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flink_join", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=1000.0, help="requests a second of event time")
    p.add_argument("--interval-s", type=float, default=100.0)
    p.add_argument("--window-s", type=float, default=30.0)
    p.add_argument("--ctr", type=float, default=0.1)
    p.add_argument("--workdir", type=Path, default=Path("artifacts/flink_join_bench"))
    p.add_argument("--parallelism", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--flink-memory", default="", help="taskmanager.memory.process.size, e.g. 2g (default Flink's)"
    )
    args = p.parse_args(argv)
    if flink_python() is None:
        print("bench.flink_join: no Flink venv: run make flink-venv", file=sys.stderr)
        return 2
    work = args.workdir
    if not (work / "input.json").is_file() or json.loads((work / "input.json").read_text()) != vars(args) | {
        "workdir": str(work),
        "parallelism": None,
    }:
        t0 = time.perf_counter()
        make_input(work, args.requests, args.rate, args.window_s, args.ctr)
        (work / "input.json").write_text(json.dumps(vars(args) | {"workdir": str(work), "parallelism": None}))
        print(f"input: {args.requests} requests in {time.perf_counter() - t0:.0f} s", flush=True)
    results = [run_embedded(args, work)]
    print(json.dumps({k: v for k, v in results[-1].items() if k != "_summary"}), flush=True)
    for par in args.parallelism:
        results.append(run_flink(args, work, par))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "_summary"}), flush=True)
    for r in results[1:]:
        assert r["_summary"] == results[0]["_summary"], f"{r['engine']} differs from the embedded join"
    out = [{k: v for k, v in r.items() if k != "_summary"} for r in results]
    (work / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    print("every engine's rows and counts agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
