"""`python -m export`: turn the best checkpoint into a new version of the model repository."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ctr_contract import run_dir, stage_trace
from ctr_contract.cli_help import DefaultsHelpFormatter
from ctr_contract.tf_log import quiet_tensorflow_import
from ctr_model.calibration import METHODS
from ctr_store.errors import StoreError
from export.errors import ExportError, InputError
from export.gates.eval_rows import EVAL_FILES
from export.gates.parity import MIN_ROWS
from export.onnx.targets import DEFAULT_PROFILE, PROFILES, resolve_target
from export.publish.bucket import repo_location
from export.request import ExportRequest, request_defaults


def build_parser() -> argparse.ArgumentParser:
    d = request_defaults()
    p = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a CTR checkpoint to ONNX + SavedModel (+ TorchScript), gate it on parity, and "
        "publish it as the next version of the model repository.",
        formatter_class=DefaultsHelpFormatter,
    )
    src = p.add_argument_group("source")
    src.add_argument(
        "--run",
        type=Path,
        help=f"training run dir: uses its {run_dir.BEST_CHECKPOINT}, {run_dir.FEATURE_SPEC}, "
        f"{run_dir.VAL_FEATURES}, {run_dir.VAL_LABELS}, {run_dir.METRICS}, and writes {run_dir.RELIABILITY_PLOT} into it "
        "(default: none; then give --checkpoint and --feature-spec)",
    )
    src.add_argument(
        "--checkpoint", type=Path, help=f"checkpoint to export (default: RUN/{run_dir.BEST_CHECKPOINT})"
    )
    src.add_argument("--feature-spec", type=Path, help=f"feature spec (default: RUN/{run_dir.FEATURE_SPEC})")
    src.add_argument(
        "--val-features",
        type=Path,
        help=f"float32 [N,width] .npy parity rows, also the drift reference's (default: RUN/{run_dir.VAL_FEATURES}; "
        "without --run, the one beside --feature-spec)",
    )
    src.add_argument(
        "--val-labels",
        type=Path,
        help=f"float32 [N] 0/1 labels of --val-features: the calibrator's fit and the quality gate (default: "
        f"RUN/{run_dir.VAL_LABELS}; without --run, the one beside --feature-spec)",
    )
    src.add_argument(
        "--val-raw",
        type=Path,
        help=f"raw validation rows (.npz) for the raw-signature gate (default: RUN/{run_dir.VAL_RAW}; without "
        "--run, the one beside --feature-spec)",
    )
    dst = p.add_argument_group("destination")
    dst.add_argument(
        "--repo",
        type=repo_location,
        default=d["repo"],
        help="model base path: a folder, or s3://BUCKET/PREFIX (credentials and endpoint from the AWS_* "
        "variables, docs/export.md) (default: %(default)s)",
    )
    dst.add_argument(
        "--version", type=int, help="version number to publish (default: highest + 1); never overwrites"
    )
    dst.add_argument(
        "--keep", type=int, help="after publishing, keep only the newest K versions (default: keep all)"
    )
    fmt = p.add_argument_group("format")
    which = fmt.add_mutually_exclusive_group()
    which.add_argument(
        "--target", choices=sorted(PROFILES), help=f"target op-set profile (default: {DEFAULT_PROFILE})"
    )
    which.add_argument(
        "--target-ops",
        help=f"explicit comma-separated ONNX op set, e.g. Gemm,Relu,Add,Sub,Sigmoid (default: the --target "
        f"profile, {DEFAULT_PROFILE})",
    )
    fmt.add_argument(
        "--opset",
        type=int,
        default=d["opset"],
        help="ONNX opset, verified on the result (default: %(default)s)",
    )
    fmt.add_argument(
        "--torchscript",
        action=argparse.BooleanOptionalAction,
        default=d["torchscript"],
        help="also write a traced model.pt (default: %(default)s)",
    )
    fmt.add_argument(
        "--calibration",
        choices=METHODS,
        default=d["calibration"],
        help="the calibrator in every graph, fitted on the validation rows: isotonic, platt, auto (the one with "
        "the lower ECE on the held-out half) or none (ctr = the network's probability, corrected for the run's "
        "negative sample rate; needs no labels) (default: %(default)s)",
    )
    fmt.add_argument(
        "--calibration-data",
        type=Path,
        help="Criteo rows (text or Parquet, export/gates/eval_rows.py) whose first 100,000 fit the calibrator "
        "instead of the validation rows, e.g. an interval's held-out partition (default: none: --val-features "
        "with --val-labels)",
    )
    gate = p.add_argument_group("parity gate")
    gate.add_argument(
        "--parity-rows",
        type=int,
        default=d["parity_rows"],
        help=f"rows compared (>= {MIN_ROWS}; default: %(default)s)",
    )
    gate.add_argument(
        "--parity-tol",
        type=float,
        default=d["parity_tol"],
        help="max abs difference allowed (default: %(default)s)",
    )
    quality = p.add_argument_group(
        "quality gate (candidate vs the newest published version, export/gates/gate.py)"
    )
    quality.add_argument(
        "--eval-data",
        type=Path,
        help="Criteo rows both models score: a Criteo text file or a Parquet file with the Criteo columns, e.g. "
        "an interval's held-out partition (default: the run's validation split)",
    )
    quality.add_argument(
        "--max-auc-drop",
        type=float,
        default=d["max_auc_drop"],
        help="refuse when the candidate's AUC is lower by more than this (default: %(default)s)",
    )
    quality.add_argument(
        "--max-ece-rise",
        type=float,
        default=d["max_ece_rise"],
        help="refuse when its expected calibration error is higher by more than this (default: %(default)s)",
    )
    quality.add_argument(
        "--max-calibration-gap",
        type=float,
        default=d["max_calibration_gap"],
        help="refuse when its calibration ratio (mean predicted / observed CTR on the gate's rows) is outside "
        "[1 - G, 1 + G], whether or not a version is served (default: %(default)s)",
    )
    quality.add_argument(
        "--force",
        action="store_true",
        help="publish even when the gate refuses (a worse or miscalibrated candidate), or cannot run for want of "
        "--eval-data; the manifest records it (default: off)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log each step, and TensorFlow's C++ start-up log (default: off, warnings only)",
    )
    return p


def request_from_args(args: argparse.Namespace) -> ExportRequest:
    """Validate the options and resolve run-dir defaults into an ExportRequest."""
    if args.run is None and args.checkpoint is None:
        raise InputError("give --run DIR (a training run) or --checkpoint FILE")
    if args.run is not None and not args.run.is_dir():
        raise InputError(f"--run {args.run} is not a directory; expected a training run dir")
    if (
        args.run is not None
        and args.checkpoint is None
        and not (args.run / run_dir.BEST_CHECKPOINT).is_file()
    ):
        raise InputError(
            f"checkpoint not found: {args.run / run_dir.BEST_CHECKPOINT}; train first (`make train` or "
            f"`python -m training --out {args.run}`)"
        )
    if args.run is None and args.feature_spec is None:
        raise InputError("no feature spec: give --feature-spec FILE or --run DIR")
    if args.val_labels is not None and not args.val_labels.is_file():
        raise InputError(
            f"--val-labels {args.val_labels} is not a file; expected the run's {run_dir.VAL_LABELS}"
        )
    for flag, path in (("--calibration-data", args.calibration_data), ("--eval-data", args.eval_data)):
        if path is not None and not path.is_file():
            raise InputError(f"{flag} {path} is not a file; expected {EVAL_FILES}")
    given = {
        "checkpoint": args.checkpoint,
        "feature_spec": args.feature_spec,
        "val_features": args.val_features,
        "val_labels": args.val_labels,
        "val_raw": args.val_raw,
    }
    # The samples (the drift reference's rows among them): a run's, or, for a lone --checkpoint, those of the
    # run that wrote the spec (python -m training writes them beside it); export refuses a version it could
    # not write a drift reference for. A lone checkpoint has no run to write its figures into.
    lone = {} if args.run is not None else {"metrics": None, "run": None}
    return ExportRequest.from_run(
        args.run if args.run is not None else args.feature_spec.parent,
        **{k: v for k, v in given.items() if v is not None},
        **lone,
        repo=args.repo,
        target=resolve_target(args.target, args.target_ops),
        version=args.version,
        keep=args.keep,
        opset=args.opset,
        torchscript=args.torchscript,
        parity_rows=args.parity_rows,
        parity_tol=args.parity_tol,
        eval_data=args.eval_data,
        max_auc_drop=args.max_auc_drop,
        max_ece_rise=args.max_ece_rise,
        max_calibration_gap=args.max_calibration_gap,
        force=args.force,
        calibration=args.calibration,
        calibration_data=args.calibration_data,
    )


def _pairs(p: dict[str, Any]) -> str:
    """Each output's worst pair difference: `ctr: a_vs_b 1e-7, ...; raw_score: ...`."""
    by_output = p.get("by_output") or {"ctr": p}
    return "; ".join(
        f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in o["max_abs_diff_by_pair"].items())
        for name, o in by_output.items()
    )


def _auc(f: dict[str, Any]) -> str:
    return "n/a" if f.get("auc") is None else f"{f['auc']:.4f}"


def _figures(f: dict[str, Any] | None) -> str:
    if not f:
        return "n/a"
    return f"ECE {f['ece']:.4f}, calibration ratio {f['calibration_ratio']:.4f}, AUC {_auc(f)}"


def summary_lines(p: dict[str, Any], cal: dict[str, Any] | None, g: dict[str, Any] | None) -> list[str]:
    """The export summary: parity of both signatures, the calibrator, the quality gate."""
    from export.gates.gate import calibration_summary  # after TensorFlow's quiet import, as export.pipeline

    r = p["raw"]
    lines = [
        f"parity: {p['rows']} rows {p['groups']}, max abs diff {p['max_abs_diff']:.3g} <= {p['tolerance']:g} "
        f"({_pairs(p)})",
        f"raw-signature parity: {r['rows']} rows {r['groups']}, max abs diff {r['max_abs_diff']:.3g} "
        f"<= {r['tolerance']:g} ({_pairs(r)})",
    ]
    if cal is not None:
        rep = cal.get("report") or {}
        line = f"calibration: {cal['method']} ({rep.get('chosen_by')}), negative sample rate {cal['negative_rate']:g}"
        if rep.get("before") and rep.get("after"):
            line += (
                f"; on the {rep['report_rows']} reporting rows (fitted on {rep['fit_rows']}): before "
                f"{_figures(rep['before'])}; after {_figures(rep['after'])}"
            )
            if rep.get("refit_rows"):
                line += f"; served: refit on all {rep['refit_rows']} rows"
        lines.append(line)
    if g is not None and g.get("skipped"):
        lines.append(
            f"quality gate: skipped: {g['skipped']}" + (" (published with --force)" if g["forced"] else "")
        )
    elif g is not None:
        c, o = g["candidate"], g["served"]
        line = f"quality gate: candidate AUC {_auc(c)} {calibration_summary(c)}"
        line += (
            f"; version {o['version']} AUC {_auc(o)} ECE {o['ece']:.4f}" if o else "; no version to compare"
        )
        lines.append(
            f"{line} on {g['eval_rows']}" + (" (refused, published with --force)" if g["forced"] else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="export: %(message)s")
    try:
        req = request_from_args(args)
        with quiet_tensorflow_import(
            args.verbose
        ):  # before export.pipeline imports it: ctr_contract/tf_log.py
            import tensorflow  # noqa: F401
        from export.pipeline import export_version

        with stage_trace.run(
            "export"
        ):  # a span per stage with the OTEL_* variables (ctr_contract/stage_trace.py)
            result = export_version(req)
    # OSError: e.g. the disk filled up while writing the version; StoreError: a bucket's fault not caught nearer
    except (ExportError, StoreError, OSError) as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 1
    print(f"published version {result.version} at {result.path} in {result.seconds:.1f} s")
    for line in summary_lines(result.parity, result.calibration, result.quality_gate):
        print(line)
    if result.removed_versions:
        print(f"retention: removed versions {result.removed_versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
