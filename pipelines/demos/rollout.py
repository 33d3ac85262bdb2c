"""`make rollout-demo` (`python -m pipelines.demos.rollout --out DIR`): a good version promoted, a bad one rolled back.

1. Three versions (pipelines/demos/rollout_models.py, one process): version 1 into DIR/repo, a good version 2
   and a miscalibrated version 3 into DIR/staging, all before the traffic starts.
2. On 127.0.0.1: the server (DIR/models.config re-read every second, every request logged to DIR/logs), the
   traffic simulator on the drifting world (clicks to DIR/clicks), live evaluation (`python -m
   pipelines.live_eval`, DIR/eval) and the rollout controller (`python -m pipelines.rollout`, DIR/rollout).
3. The controller makes version 1 stable. Once stable has live figures, version 2 is published (moved into
   DIR/repo) and the demo waits for its promotion; then version 3, and the demo waits for its rollback. Then
   every process is stopped.
4. DIR/report.md, DIR/rollout.png and DIR/results.json (pipelines/demos/rollout_report.py).

--short runs the same with shorter intervals and fewer rows (the test in `make test`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipelines.demos import rollout_models
from pipelines.demos.rollout_report import Timeline, write_report

PY = sys.executable
LONG = {
    "interval_s": 10.0,
    "attribution_s": 5.0,
    "window_s": 60.0,
    "min_rows": 300,
    "v2_rows": 30000,
    "bad_rows": 20000,
    "tail_s": 20.0,
}
SHORT = {
    "interval_s": 4.0,
    "attribution_s": 2.0,
    "window_s": 24.0,
    "min_rows": 120,
    "v2_rows": 12000,
    "bad_rows": 5000,
    "tail_s": 4.0,
}


class DemoError(RuntimeError):
    """A step of the demo failed or timed out; the message says which and names its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def initial_config(out: Path) -> Path:
    """The model config file: version 1 listed, no label; the controller owns it from here on."""
    path = out / "models.config"
    path.write_text(
        'model_config_list {\n  config {\n    name: "ctr"\n'
        f'    base_path: "{out / "repo"}"\n    model_platform: "tensorflow"\n'
        "    model_version_policy { specific { versions: 1 } }\n  }\n}\n"
    )
    return path


class Procs:
    """The demo's long-running processes, each with its log in OUT; stopped in reverse order."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.out / f"{name}.log").open("w")
        proc = subprocess.Popen([PY, "-m", *args], stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, proc))
        return proc

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None and name != "models":
                tail = (self.out / f"{name}.log").read_text()[-2000:]
                raise DemoError(f"{name} exited {proc.returncode}; see {self.out / name}.log:\n{tail}")
        models = dict(self.procs).get("models")
        if models is not None and models.poll() not in (None, 0):
            tail = (self.out / "models.log").read_text()[-2000:]
            raise DemoError(f"the models' training or export failed; see {self.out / 'models.log'}:\n{tail}")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        proc = dict(self.procs).get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for name, _ in reversed(self.procs):
            self.stop(name)


def wait_for(
    what: str, ready: Callable[[], bool], timeout_s: float, procs: Procs, timeline: Timeline
) -> float:
    """Poll `ready` (and the timeline, and the processes) every 0.25 s; the time it came true."""
    end = time.time() + timeout_s
    while time.time() < end:
        timeline.poll()
        procs.check()
        if ready():
            return time.time()
        time.sleep(0.25)
    raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def live_rows(eval_state: Path, version: int, label: str) -> int:
    """Joined rows of (version, label) in the evaluator's newest snapshot that have figures."""
    try:
        snapshot = json.loads((eval_state / "snapshot.json").read_text())
    except (OSError, ValueError):
        return 0
    return max(
        (
            int(f.get("rows") or 0)
            for f in snapshot.get("figures", [])
            if f.get("version") == version and f.get("label") == label and f.get("auc") is not None
        ),
        default=0,
    )


def run_demo(a: argparse.Namespace, out: Path, procs: Procs, timeline: Timeline, t: dict[str, float]) -> None:
    """Every step up to the bad version's rollback; the milestones' times go into `t`."""
    t["begin"] = time.time()
    ev, ro = out / "eval", out / "rollout"
    procs.start(
        "models",
        *("pipelines.demos.rollout_models", "--out", str(out), "--v1-rows", str(a.v1_rows)),
        *(
            "--v2-rows",
            str(a.v2_rows),
            "--bad-rows",
            str(a.bad_rows),
            "--bad",
            a.bad,
            "--start-day",
            str(a.start_day),
        ),
        *("--drift-scale", str(a.drift_scale)),
    )
    print("rollout-demo: training and exporting version 1", flush=True)
    wait_for("version 1", lambda: rollout_models.done(out, 1).exists(), a.phase_timeout_s, procs, timeline)
    config = initial_config(out)
    rest, grpc = free_port(), free_port()
    url = f"http://127.0.0.1:{rest}"
    procs.start(
        "server",
        *("serving", f"--port={grpc}", f"--rest_api_port={rest}", "--host=127.0.0.1"),
        *(f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=1"),
        *("--file_system_poll_wait_seconds=1", f"--request_log_dir={out / 'logs'}"),
        *("--request_log_sample_rate=1", "--request_log_max_bytes=4000000"),
    )
    procs.start(
        "live_eval",
        *("pipelines.live_eval", "--logs", str(out / "logs"), "--clicks", str(out / "clicks")),
        *("--state-dir", str(ev), "--window-s", str(a.window_s), "--interval-s", str(a.interval_s)),
        *("--attribution-window-s", str(a.attribution_s), "--min-rows", str(a.min_rows)),
        *("--metrics-port", str(free_port()), "--metrics-host", "127.0.0.1"),
    )
    policy = {"steps": a.steps.split(","), "canary_percent": a.canary_percent, "min_rows": a.min_rows}
    policy |= {"shadow_percent": a.shadow_percent, "calibration_bound": a.calibration_bound}
    (out / "policy.json").write_text(json.dumps(policy, indent=1) + "\n")
    procs.start(
        "rollout",
        *("pipelines.rollout", "--model-config", str(config), "--model", "ctr", "--eval-state", str(ev)),
        *("--state-dir", str(ro), "--server", url, "--policy", str(out / "policy.json")),
        *("--interval-s", str(a.tick_s), "--metrics-port", str(free_port())),
    )
    timeline.url = f"{url}/v1/models/ctr"
    wait_for("the server", timeline.up, a.phase_timeout_s, procs, timeline)
    wait_for("version 1 to become stable", lambda: timeline.stable == 1, a.phase_timeout_s, procs, timeline)
    print("rollout-demo: version 1 is stable; training and exporting versions 2 and 3", flush=True)
    # The candidates are built before the traffic starts: on a small box, training beside the traffic,
    # the server and the evaluator would slow all of them.
    wait_for(
        "versions 2 and 3", lambda: rollout_models.done(out, 3).exists(), a.phase_timeout_s, procs, timeline
    )
    procs.start(
        "simulate",
        *("pipelines.demos.simulate", "--url", url, "--clicks-dir", str(out / "clicks")),
        *(
            "--start-day",
            str(a.start_day),
            "--end-day",
            str(a.end_day),
            "--duration",
            str(a.traffic_budget_s),
        ),
        *("--rate", str(a.rate), "--instances", str(a.instances), "--drift-scale", str(a.drift_scale)),
        *(
            "--click-delay-s",
            str(a.attribution_s / 8),
            "--drain-s",
            "0",
            "--summary",
            str(out / "simulate.json"),
        ),
    )
    t["traffic"] = time.time()
    print(f"rollout-demo: server on {url}; traffic, live evaluation and the controller started", flush=True)
    wait_for(
        f"{a.min_rows} live rows of stable version 1",
        lambda: live_rows(ev, 1, "stable") >= a.min_rows,
        a.phase_timeout_s,
        procs,
        timeline,
    )
    rollout_models.publish(out, 2)
    t["published_2"] = time.time()
    print("rollout-demo: published version 2 (good); waiting for its promotion", flush=True)
    t["promoted_2"] = wait_for(
        "version 2's promotion",
        lambda: timeline.stable == 2 or 2 in timeline.rejected(),
        a.phase_timeout_s,
        procs,
        timeline,
    )
    if timeline.stable != 2:
        raise DemoError(f"version 2 was rolled back: {timeline.decision(2, 'rollback')}")
    rollout_models.publish(out, 3)
    t["published_3"] = time.time()
    print("rollout-demo: published version 3 (bad); waiting for its rollback", flush=True)
    t["decided_3"] = wait_for(
        "version 3's rollback",
        lambda: timeline.stable == 3 or 3 in timeline.rejected(),
        a.phase_timeout_s,
        procs,
        timeline,
    )
    end = time.time() + a.tail_s
    wait_for("the tail of traffic", lambda: time.time() >= end, a.tail_s + 5, procs, timeline)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.demos.rollout", description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, default=Path("artifacts/rollout-demo"), help="output folder (emptied first)"
    )
    p.add_argument("--short", action="store_true", help="shorter intervals and fewer rows (make test's run)")
    p.add_argument("--interval-s", type=float, help="live evaluation interval (default 10; --short 4)")
    p.add_argument("--attribution-s", type=float, help="attribution window (default 5; --short 2)")
    p.add_argument("--window-s", type=float, help="live evaluation's sliding window (default 60; --short 24)")
    p.add_argument("--min-rows", type=int, help="rows before a figure counts (default 300; --short 120)")
    p.add_argument("--v1-rows", type=int, default=3000, help="version 1's training rows (default 3000)")
    p.add_argument("--v2-rows", type=int, help="version 2's training rows (default 30000; --short 12000)")
    p.add_argument("--bad-rows", type=int, help="rows of each calibration file (default 20000; --short 5000)")
    p.add_argument("--bad", choices=rollout_models.BAD_KINDS, default="shifted", help="version 3's fault")
    p.add_argument("--steps", default="canary,stable", help="the policy's steps (default canary,stable)")
    p.add_argument("--canary-percent", type=float, default=10.0, help="canary share (default 10)")
    p.add_argument("--shadow-percent", type=float, default=10.0, help="shadow share (default 10)")
    p.add_argument(
        "--calibration-bound", type=float, default=0.1, help="ratio within [1-b, 1+b] (default 0.1)"
    )
    p.add_argument("--rate", type=float, default=40.0, help="requests per second (default 40)")
    p.add_argument("--instances", type=int, default=10, help="rows per request (default 10)")
    p.add_argument("--tick-s", type=float, default=1.0, help="the controller's tick (default 1)")
    p.add_argument("--start-day", type=float, default=0.0)
    p.add_argument("--end-day", type=float, default=0.02, help="world day when the traffic budget ends")
    p.add_argument("--drift-scale", type=float, default=24.0)
    p.add_argument("--traffic-budget-s", type=float, default=900.0, help="the simulator's longest run")
    p.add_argument("--phase-timeout-s", type=float, default=240.0, help="longest wait for one step")
    p.add_argument("--tail-s", type=float, help="traffic after the rollback (default 20; --short 4)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    for key, value in (SHORT if a.short else LONG).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    out = a.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    procs, timeline = Procs(out), Timeline(out / "models.config", out / "rollout")
    error: str | None = None
    t: dict[str, float] = {}
    try:
        run_demo(a, out, procs, timeline, t)
    except (DemoError, OSError) as exc:
        error = str(exc)
        print(f"rollout-demo: error: {exc}", file=sys.stderr)
    finally:
        procs.stop("simulate", signal.SIGINT)
        procs.stop_all()
    timeline.poll()
    results = write_report(out, vars(a), t, timeline, error)
    print(f"rollout-demo: wrote {out / 'report.md'}, {out / 'rollout.png'} and {out / 'results.json'}")
    return 0 if error is None and results["promoted"] and results["rolled_back"] else 1


if __name__ == "__main__":
    sys.exit(main())
