"""`python -m pipelines.live_eval`: live AUC, log loss, NE and calibration per model, version and label.

    python -m pipelines.live_eval --logs LOGS --clicks CLICKS --state-dir artifacts/live-eval \
        --window-s 300 --interval-s 10 --attribution-window-s 60 --min-rows 500 --metrics-port 9108

Every --interval-s seconds of request time is joined with its clicks once its attribution window has closed
(the online trainer's join, pipelines/clicks/join.py); the figures over the last --window-s seconds of joined
intervals go to Prometheus gauges, STATE/snapshot.json and one STATE/history.jsonl line per interval. State
lives in --state-dir: a killed evaluator restarts where it stopped, no interval evaluated twice or skipped.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from pipelines.clicks.events import parse_time
from pipelines.clicks.join import join_interval
from pipelines.live_eval.metrics import LiveMetrics
from pipelines.live_eval.service import JoinFunction, LiveEval, Settings
from pipelines.service import flags
from pipelines.service.clock import IntervalClock
from pipelines.service.loop import Stop

# Its flink_join_interval has the embedded join_interval's signature (docs/live-eval.md).
FLINK_MODULE = "pipelines.clicks.flink.engine"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.live_eval", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument(
        "--logs", type=Path, required=True, help="request log folder (the servers' --request_log_dir)"
    )
    p.add_argument("--clicks", type=Path, required=True, help="click events folder (JSON lines)")
    p.add_argument(
        "--state-dir", type=Path, required=True, help="state, snapshot, history and joined partitions"
    )
    p.add_argument(
        "--window-s", type=float, default=300.0, help="sliding window of joined intervals (default 300)"
    )
    flags.add_clock_flags(
        p, 10.0, "--attribution-window-s", 60.0, "a click counts this long after its request"
    )
    p.add_argument(
        "--min-rows",
        type=int,
        default=500,
        help="no figure of a key with fewer joined rows in the window (default 500)",
    )
    p.add_argument(
        "--keep-joined-s",
        type=float,
        default=86_400.0,
        help="joined partitions are deleted once older than this and out of the window (default 86400)",
    )
    flags.add_metrics_flags(p, 9108)
    flags.add_engine_flag(p)
    flags.add_run_flags(p, "evaluated", parse_time, intervals=True)
    return p


def join_function(engine: str) -> JoinFunction:
    """The join of `--engine`; raises ValueError when the Flink join or its venv is not installed."""
    if engine == "embedded":
        return join_interval
    try:
        module = importlib.import_module(FLINK_MODULE)  # lazily: the embedded default needs none of it
    except ImportError as e:
        raise ValueError(f"--engine flink needs {FLINK_MODULE}: {e}") from e
    if module.flink_python() is None:
        raise ValueError(
            "--engine flink: no Flink venv (make flink-venv installs apache-flink and Java 17; or set "
            "$CTR_FLINK_PYTHON)"
        )
    return module.flink_join_interval  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    flags.setup_logging("pipelines.live_eval")
    clock = IntervalClock(args.interval_s, args.attribution_window_s)
    problems = flags.clock_problems(clock, "--attribution-window-s")
    if args.window_s < args.interval_s:
        problems.append(
            f"--window-s ({args.window_s:g}) must hold at least one interval ({args.interval_s:g} s)"
        )
    if args.min_rows < 0 or (args.intervals is not None and args.intervals < 0):
        problems.append("--min-rows and --intervals must be >= 0")
    if problems:
        print(f"live_eval: error: {'; '.join(problems)}", file=sys.stderr)
        return 2

    def start(stop: Stop) -> None:
        s = flags.settings(Settings, args, join=join_function(args.engine))
        metrics = LiveMetrics()
        evaluator = LiveEval(s, metrics, clock.first(args.start))
        flags.serve_metrics(metrics.registry, args.metrics_port, args.metrics_host)
        evaluator.run(args.until, args.intervals, stop)

    # RuntimeError: a Flink job that failed
    return flags.run_service("live_eval", start, (ValueError, OSError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
