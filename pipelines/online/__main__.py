"""`python -m pipelines.online`: the online trainer, a long-running loop over closed intervals (docs/online-learning.md).

    python -m pipelines.online --logs LOGS --clicks CLICKS --repo artifacts/models/ctr --work artifacts/online

Every --interval-s seconds of request time becomes one interval: once its attribution window has closed, the
trainer joins it (requests x clicks), warm-starts from the newest published version on its rows plus the
--replay intervals before it, exports through the quality gate (scored on the interval's held-out rows) and
publishes; servers polling --repo hot-reload the new version. State lives in --work: a killed trainer
restarts where it stopped, no interval trained twice or skipped.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ctr_model.calibration import METHODS
from ctr_store.errors import StoreError
from ctr_store.url import BucketPath, is_bucket_path
from export.publish.bucket import repo_location
from pipelines.clicks.events import parse_time
from pipelines.online.loop import Trainer
from pipelines.online.metrics import TrainerMetrics
from pipelines.online.step import STEP_OWNED, Settings, warm_imports
from pipelines.service import flags
from pipelines.service.clock import IntervalClock
from pipelines.service.loop import Stop
from training.config import TrainConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.online", description=__doc__.splitlines()[0])
    p.add_argument(
        "--logs", type=Path, required=True, help="request log folder (the servers' --request_log_dir)"
    )
    p.add_argument("--clicks", type=Path, required=True, help="click events folder (JSON lines)")
    p.add_argument(
        "--repo",
        type=repo_location,
        default=Path("artifacts/models/ctr"),
        help="model base path to publish to and warm-start from: a folder or s3://BUCKET/PREFIX (docs/export.md)",
    )
    p.add_argument("--work", type=Path, default=Path("artifacts/online"), help="state, joined data and runs")
    flags.add_clock_flags(p, 3600.0, "--window-s", 1800.0, "attribution window in seconds")
    p.add_argument(
        "--holdout", type=float, default=0.2, help="share of requests held out for the gate (default 0.2)"
    )
    p.add_argument(
        "--replay", type=int, default=2, help="earlier intervals replayed with the new one (default 2)"
    )
    p.add_argument(
        "--replay-rows", type=int, default=50_000, help="at most this many replayed rows (default 50000)"
    )
    p.add_argument("--epochs", type=int, default=1, help="epochs per interval (default 1)")
    p.add_argument(
        "--max-auc-drop", type=float, default=0.002, help="quality gate: allowed AUC drop (default 0.002)"
    )
    p.add_argument(
        "--max-ece-rise",
        type=float,
        default=0.01,
        help="quality gate: allowed calibration error rise (default 0.01)",
    )
    p.add_argument(
        "--max-calibration-gap",
        type=float,
        default=0.05,
        help="quality gate: refuse a calibration ratio outside [1 - G, 1 + G] (default 0.05)",
    )
    p.add_argument(
        "--calibration",
        choices=METHODS,
        default="auto",
        help="export's calibrator, fitted on each interval's held-out rows (default auto)",
    )
    p.add_argument(
        "--train-args",
        default="",
        help="python -m training options for each interval's run, e.g. '--batch-size 512' (--epochs sets "
        "--max-epochs; --data, --out, --init-from and --resume are the trainer's own)",
    )
    flags.add_run_flags(p, "trained", parse_time)
    flags.add_metrics_flags(p, 0)
    flags.add_engine_flag(p)
    return p


def train_config(epochs: int, train_args: str) -> TrainConfig:
    """Each interval's run as `--epochs` and `--train-args` set it (step.py gives it data, out and warm start)."""
    from training.cli import parse_config  # torch: after this CLI's own options are checked

    cfg = parse_config(shlex.split(train_args), TrainConfig(max_epochs=epochs))
    default = TrainConfig()
    owned = [f"--{k.replace('_', '-')}" for k in STEP_OWNED if getattr(cfg, k) != getattr(default, k)]
    if owned:
        raise ValueError(f"{', '.join(owned)}: the trainer sets these for each interval; leave them out")
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    flags.setup_logging("pipelines.online")
    clock = IntervalClock(args.interval_s, args.window_s)
    problems = flags.clock_problems(clock, "--window-s")
    if not problems and args.window_s > args.interval_s:
        problems.append(f"need --window-s ({args.window_s:g}) <= --interval-s ({args.interval_s:g})")
    if problems:
        print(f"online: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if not 0 <= args.holdout < 1 or args.replay < 0:
        print(
            f"online: error: --holdout must be in [0, 1) and --replay >= 0, got {args.holdout:g} and {args.replay}",
            file=sys.stderr,
        )
        return 2
    try:
        train = train_config(args.epochs, args.train_args)
    except (ValueError, OSError) as e:  # training's ConfigError is a ValueError
        print(f"online: error: --train-args: {e}", file=sys.stderr)
        return 2
    s = flags.settings(Settings, args, train=train)
    if args.engine == "flink":
        from pipelines.clicks.flink.engine import flink_python

        if flink_python() is None:
            print("online: error: --engine flink needs the Flink venv: run make flink-venv", file=sys.stderr)
            return 2
    if is_bucket_path(args.repo):
        try:
            BucketPath.parse(str(args.repo))
        except ValueError as e:
            print(f"online: error: --repo: {e}", file=sys.stderr)
            return 2

    def start(stop: Stop) -> None:
        metrics = TrainerMetrics()
        trainer = Trainer(s, metrics, clock.first(args.start))
        flags.serve_metrics(metrics.registry, args.metrics_port, args.metrics_host)
        warm_imports()
        trainer.run(args.until, stop)

    return flags.run_service("online", start, (ValueError, OSError, StoreError))


if __name__ == "__main__":
    sys.exit(main())
