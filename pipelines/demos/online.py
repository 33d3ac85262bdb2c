"""`make online-demo` (`python -m pipelines.demos.online --out DIR`): server + simulator + online trainer, then a report.

1. Version 1, the static model: trained on --static-rows rows of --start-day and exported into DIR/repo.
2. A server on 127.0.0.1 serves DIR/repo and logs every request; the simulator sends drifting traffic for
   --duration seconds while world time runs from --start-day to --end-day under --drift-scale; the online
   trainer turns each closed --interval-s interval into a new version through the quality gate.
3. DIR/report.md and DIR/results.json: per interval, the AUC on the next interval's traffic of the static
   version 1, the online model and the oracle; freshness from click to served version; interval wall times,
   and the training time of one interval at 10x the demo's rate.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctr_model.calibration import METHODS
from pipelines.demos.online_evaluate import evaluate
from pipelines.demos.online_report import write_report
from pipelines.online.step import replay_parts

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], log: Path) -> None:
    """Run one step to completion, its output into `log`; exit with the log's tail when it fails."""
    with log.open("a") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(
            f"online-demo: error: {' '.join(cmd[:3])} failed ({code}); see {log}:\n{log.read_text()[-2000:]}"
        )


def static_version(a: argparse.Namespace, out: Path) -> None:
    """Version 1: the model trained before the traffic started (the daily loop's model)."""
    data = out / "static" / "day.txt"
    run(
        [
            PY,
            "-m",
            "training.synth",
            "--out",
            str(data),
            "--rows",
            str(a.static_rows),
            "--day",
            str(a.start_day),
            "--drift-scale",
            str(a.drift_scale),
        ],
        out / "static.log",
    )
    run(
        [
            PY,
            "-m",
            "training",
            "--data",
            str(data),
            "--out",
            str(out / "static" / "run"),
            "--no-progress-bar",
            "--max-epochs",
            "2",
            *a.train_args.split(),
        ],
        out / "static.log",
    )
    run(
        [
            *(PY, "-m", "export", "--run", str(out / "static" / "run"), "--repo", str(out / "repo")),
            *("--calibration", a.calibration, "--max-calibration-gap", str(a.max_calibration_gap)),
        ],
        out / "static.log",
    )


class Watcher(threading.Thread):
    """Polls the server's model status each second: when each version became AVAILABLE."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.seen: dict[int, float] = {}

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    status = json.load(r)["model_version_status"]
            except (OSError, ValueError, KeyError):
                continue
            for v in status:
                if v.get("state") == "AVAILABLE":
                    self.seen.setdefault(int(v["version"]), time.time())


def wait_ready(url: str, timeout_s: float = 120) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"online-demo: error: the server at {url} did not come up in {timeout_s:.0f} s")


def ten_x(a: argparse.Namespace, out: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Train one interval at 10x the demo's rate: the biggest interval's rows ten times over.

    At 10x every earlier interval is over the replay's row budget (--replay-rows, 50,000), so none is replayed.

    At 10x the rows the batch is 4x larger (2048, the training default), so the optimizer takes 2.5x the
    steps of a demo interval. Training seconds come from the run's own throughput line (process start-up,
    paid once by the long-running trainer, is left out).
    """
    published = [o for o in state["outcomes"] if o["outcome"] == "published"]
    if not published:
        return {}
    last = max(published, key=lambda o: o["rows"])
    folder = out / "tenx" / "data"
    folder.mkdir(parents=True, exist_ok=True)
    rows = 0
    data = out / "work" / "data"
    for part in replay_parts(data, last["interval"], a.replay, 0):  # 10x rows: the replay is over its budget
        table = pq.read_table(part)
        pq.write_table(pa.concat_tables([table] * 10), folder / part.name)
        rows += 10 * len(table)
    run(
        [
            PY,
            "-m",
            "training",
            "--data",
            str(folder),
            "--out",
            str(out / "tenx" / "run"),
            "--no-progress-bar",
            "--max-epochs",
            "1",
            "--init-from",
            str(out / "repo" / str(last["version"])),
            *a.train_args.split(),
            "--batch-size",
            "2048",
        ],
        out / "tenx.log",
    )
    found = ([None, *re.finditer(r"([0-9.]+) training samples/s", (out / "tenx.log").read_text())])[-1]
    per_s = float(found.group(1)) if found else None
    train_s = (
        round(rows * 0.9 / per_s, 1) if per_s else None
    )  # 10% of the rows are the run's validation split
    return {"rows": rows, "samples_per_s": per_s, "train_s": train_s, "export_s": last.get("export_s")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.demos.online", description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, default=Path("artifacts/online-demo"), help="output folder (emptied first)"
    )
    p.add_argument("--duration", type=float, default=300, help="seconds of traffic (default 300)")
    p.add_argument("--interval-s", type=float, default=60, help="trainer interval (default 60)")
    p.add_argument("--window-s", type=float, default=10, help="attribution window (default 10)")
    p.add_argument("--start-day", type=float, default=0.0)
    p.add_argument("--end-day", type=float, default=0.25, help="world day at the end (default 0.25: 6 hours)")
    p.add_argument("--drift-scale", type=float, default=24, help="drift speed (default 24: an hour is a day)")
    p.add_argument("--rate", type=float, default=20, help="requests per second (default 20)")
    p.add_argument("--instances", type=int, default=8, help="rows per request (default 8)")
    p.add_argument("--static-rows", type=int, default=20000, help="rows version 1 trains on (default 20000)")
    p.add_argument("--replay", type=int, default=2)
    # The demo's world drifts 24x (an hour is a day) and its click rate climbs within each one-minute interval;
    # each candidate's calibrator is fitted on its interval's held-out rows (pipelines/online/step.py), so the
    # trainer's own 0.01 calibration gate holds here too.
    p.add_argument(
        "--max-ece-rise",
        type=float,
        default=0.01,
        help="the trainer's calibration gate (default 0.01, as python -m pipelines.online)",
    )
    p.add_argument(
        "--max-calibration-gap",
        type=float,
        default=0.05,
        help="the gate's calibration ratio bound for every version: [1 - G, 1 + G] (default 0.05)",
    )
    p.add_argument(
        "--calibration",
        choices=METHODS,
        default="auto",
        help="export's calibrator for every version (default auto; a tiny demo's intervals need none)",
    )
    p.add_argument("--train-args", default="--batch-size 512", help="extra flags for python -m training")
    a = p.parse_args(argv)
    out = a.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t_begin = time.time()
    print(
        f"online-demo: training the static version 1 on {a.static_rows} rows of day {a.start_day:g}",
        flush=True,
    )
    static_version(a, out)
    rest, grpc, metrics = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [
            PY,
            "-m",
            "serving",
            f"--port={grpc}",
            f"--rest_api_port={rest}",
            "--host=127.0.0.1",
            "--model_name=ctr",
            f"--model_base_path={out / 'repo'}",
            f"--request_log_dir={out / 'logs'}",
            "--request_log_sample_rate=1",
            "--request_log_max_bytes=2000000",
            "--file_system_poll_wait_seconds=1",
        ],
        stdout=(out / "server.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    procs = [server]
    try:
        status_url = f"http://127.0.0.1:{rest}/v1/models/ctr"
        wait_ready(status_url)
        watcher = Watcher(status_url)
        watcher.start()
        start = time.time() + 1
        until = start + a.duration
        print(f"online-demo: server on 127.0.0.1:{rest}; traffic for {a.duration:.0f} s", flush=True)
        trainer = subprocess.Popen(
            [
                PY,
                "-m",
                "pipelines.online",
                "--logs",
                str(out / "logs"),
                "--clicks",
                str(out / "clicks"),
                "--repo",
                str(out / "repo"),
                "--work",
                str(out / "work"),
                "--interval-s",
                str(a.interval_s),
                "--window-s",
                str(a.window_s),
                "--start",
                str(start),
                "--until",
                str(until - a.interval_s),
                "--replay",
                str(a.replay),
                "--max-ece-rise",
                str(a.max_ece_rise),
                "--calibration",
                a.calibration,
                "--max-calibration-gap",
                str(a.max_calibration_gap),
                "--train-args",
                a.train_args,
                "--metrics-port",
                str(metrics),
            ],
            stdout=(out / "trainer.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        procs.append(trainer)
        time.sleep(3)
        if trainer.poll() is not None:
            sys.exit(
                f"online-demo: error: the trainer exited {trainer.returncode}; see {out / 'trainer.log'}"
            )
        run(
            [
                PY,
                "-m",
                "pipelines.demos.simulate",
                "--url",
                f"http://127.0.0.1:{rest}",
                "--clicks-dir",
                str(out / "clicks"),
                "--truth-dir",
                str(out / "truth"),
                "--start-day",
                str(a.start_day),
                "--end-day",
                str(a.end_day),
                "--duration",
                str(until - time.time()),
                "--rate",
                str(a.rate),
                "--instances",
                str(a.instances),
                "--drift-scale",
                str(a.drift_scale),
                "--click-delay-s",
                str(a.window_s / 4),
                "--drain-s",
                str(a.window_s + 3),
            ],
            out / "simulate.log",
        )
        trainer.wait(timeout=a.interval_s * 3 + 120)
        time.sleep(2.5)  # the server's next poll of the repository
        watcher.stop.set()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    state = json.loads((out / "work" / "state.json").read_text())
    print(
        "online-demo: scoring each interval's next interval; training one interval at 10x the rate",
        flush=True,
    )
    rows = evaluate(out / "work" / "data", out / "repo", out / "truth", state["outcomes"])
    results = {
        "repo": str(out / "repo"),
        "end_day": a.end_day,
        "start_day": a.start_day,
        "drift_scale": a.drift_scale,
        "interval_s": a.interval_s,
        "window_s": a.window_s,
        "rate_requests_per_s": a.rate,
        "instances_per_request": a.instances,
        "published_versions": sorted(int(v) for v in state["newest_row_time"]),
        "served_at": {str(v): t for v, t in watcher.seen.items()},
        "outcomes": state["outcomes"],
        "intervals": rows,
        "ten_x": ten_x(a, out, state),
        "wall_s": round(time.time() - t_begin, 1),
    }
    write_report(out, results)
    print(f"online-demo: wrote {out / 'report.md'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
