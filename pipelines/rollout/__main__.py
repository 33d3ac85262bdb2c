"""`python -m pipelines.rollout`: moves each new version of a model through shadow, canary and stable (docs/rollout.md).

    python -m pipelines.rollout --model-config models.config --model ctr --eval-state artifacts/live-eval \\
        --state-dir artifacts/rollout --server http://127.0.0.1:8501

It acts only through the model config file the servers re-read (`--model_config_file` with
`--model_config_file_poll_wait_seconds`): version labels, the `specific` version policy and the model's
`# ctr-traffic:` line. Decisions go to STATE/decisions.jsonl, state to STATE/state.json; a killed controller
restarts where it stopped, no decision lost or repeated.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ctr_contract.cli_help import RawDescriptionDefaultsHelpFormatter
from pipelines.rollout.config_file import ConfigFileError
from pipelines.rollout.controller import Controller
from pipelines.rollout.journal import Store
from pipelines.rollout.metrics import RolloutMetrics
from pipelines.rollout.policy import PolicyError, load_policy
from pipelines.rollout.server import ServerProbe
from pipelines.service import flags
from pipelines.service.loop import Stop


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.rollout",
        description=__doc__.splitlines()[0],
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    p.add_argument("--model-config", type=Path, required=True, help="the servers' --model_config_file")
    p.add_argument("--model", default="ctr", help="the model (its config entry's name) to roll out")
    p.add_argument("--eval-state", type=Path, required=True, help="the live evaluator's --state-dir")
    p.add_argument("--state-dir", type=Path, required=True, help="decisions.jsonl and state.json")
    p.add_argument(
        "--server",
        default="http://127.0.0.1:8501",
        help="a server's REST URL for load states and fallbacks; 'none': no server (a listed version counts as loaded)",
    )
    p.add_argument("--policy", type=Path, help="policy JSON (docs/rollout.md; default: the built-in policy)")
    p.add_argument("--steps", help="comma-separated steps, e.g. shadow,canary,stable (default: the policy's)")
    for flag, kind in (
        ("--shadow-percent", float),
        ("--canary-percent", float),
        ("--min-rows", int),
        ("--auc-margin", float),
        ("--confidence", float),
        ("--calibration-bound", float),
        ("--calibration-z", float),
        ("--load-timeout-s", float),
    ):
        p.add_argument(flag, type=kind, help="overrides the policy's value (default: the policy's)")
    p.add_argument("--interval-s", type=float, default=10.0, help="seconds between ticks")
    flags.add_metrics_flags(p, 9109)
    p.add_argument("--once", action="store_true", help="decide what is due now, then exit (default: off)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    flags.setup_logging("pipelines.rollout", sys.stderr)
    overrides = {
        key: getattr(args, key)
        for key in (
            "shadow_percent",
            "canary_percent",
            "min_rows",
            "auc_margin",
            "confidence",
            "calibration_bound",
            "calibration_z",
            "load_timeout_s",
        )
    }
    overrides["steps"] = args.steps.split(",") if args.steps else None
    try:
        policy = load_policy(args.policy, overrides)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    probe = None if args.server.lower() == "none" else ServerProbe(args.server)
    metrics = RolloutMetrics()
    try:
        controller = Controller(
            args.model_config, args.model, args.eval_state, Store(args.state_dir), policy, probe, metrics
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.once:
        try:
            if not controller.tick() and controller.pending is not None:
                return 1
        except ConfigFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0

    def start(stop: Stop) -> None:
        flags.serve_metrics(metrics.registry, args.metrics_port, args.metrics_host)
        logging.getLogger("pipelines.rollout").info(
            "%s: rolling out with %s; stable %s, candidate %s",
            args.model,
            policy.to_dict(),
            controller.state.stable,
            controller.state.candidate,
        )
        controller.run(args.interval_s, stop)

    return flags.run_service("rollout", start)


if __name__ == "__main__":
    sys.exit(main())
