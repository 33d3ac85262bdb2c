"""`python -m export`: turn the best checkpoint into a new version of the model repository."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from export.errors import ExportError, InputError
from export.parity import MIN_ROWS
from export.targets import DEFAULT_PROFILE, PROFILES, resolve_target

if TYPE_CHECKING:
    from export.pipeline import ExportRequest


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a CTR checkpoint to ONNX + SavedModel (+ TorchScript), gate it on parity, and "
        "publish it as the next version of the model repository.",
    )
    src = p.add_argument_group("source")
    src.add_argument(
        "--run",
        type=Path,
        help="training run dir: uses its checkpoints/best.ckpt, feature_spec.json, val_features.npy, metrics.json",
    )
    src.add_argument(
        "--checkpoint", type=Path, help="checkpoint to export (default: RUN/checkpoints/best.ckpt)"
    )
    src.add_argument("--feature-spec", type=Path, help="feature_spec.json (default: RUN/feature_spec.json)")
    src.add_argument(
        "--val-features", type=Path, help="float32 [N,width] .npy parity rows (default: RUN/val_features.npy)"
    )
    dst = p.add_argument_group("destination")
    dst.add_argument(
        "--repo",
        type=Path,
        default=Path("artifacts/models/ctr"),
        help="model base path (default: %(default)s)",
    )
    dst.add_argument(
        "--version", type=int, help="version number to publish (default: highest + 1); never overwrites"
    )
    dst.add_argument("--keep", type=int, help="after publishing, keep only the newest K versions")
    fmt = p.add_argument_group("format")
    which = fmt.add_mutually_exclusive_group()
    which.add_argument(
        "--target", choices=sorted(PROFILES), help=f"target op-set profile (default: {DEFAULT_PROFILE})"
    )
    which.add_argument(
        "--target-ops", help="explicit comma-separated ONNX op set, e.g. Gemm,Relu,Add,Sub,Sigmoid"
    )
    fmt.add_argument(
        "--opset", type=int, default=17, help="ONNX opset, verified on the result (default: %(default)s)"
    )
    fmt.add_argument(
        "--torchscript",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also write a traced model.pt",
    )
    gate = p.add_argument_group("parity gate")
    gate.add_argument(
        "--parity-rows",
        type=int,
        default=MIN_ROWS,
        help=f"rows compared (>= {MIN_ROWS}; default: %(default)s)",
    )
    gate.add_argument(
        "--parity-tol", type=float, default=1e-5, help="max abs difference allowed (default: %(default)s)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log each step")
    return p


def _default(explicit: Path | None, run: Path | None, rel: str, required: bool) -> Path | None:
    if explicit is not None:
        return explicit
    if run is None:
        return None
    path = run / rel
    return path if required or path.is_file() else None


def request_from_args(args: argparse.Namespace) -> ExportRequest:
    """Validate the options and resolve run-dir defaults into an ExportRequest."""
    from export.pipeline import ExportRequest  # deferred: it pulls in onnx and the exporter

    if args.run is None and args.checkpoint is None:
        raise InputError("give --run DIR (a training run) or --checkpoint FILE")
    if args.run is not None and not args.run.is_dir():
        raise InputError(f"--run {args.run} is not a directory; expected a training run dir")
    checkpoint = _default(args.checkpoint, args.run, "checkpoints/best.ckpt", True)
    if args.checkpoint is None and checkpoint is not None and not checkpoint.is_file():
        raise InputError(
            f"checkpoint not found: {checkpoint}; train first (`make train` or `python -m training --out {args.run}`)"
        )
    assert checkpoint is not None  # --checkpoint or --run is given
    spec = _default(args.feature_spec, args.run, "feature_spec.json", True)
    if spec is None:
        raise InputError("no feature spec: give --feature-spec FILE or --run DIR")
    if args.parity_rows < MIN_ROWS:
        raise InputError(f"--parity-rows must be >= {MIN_ROWS}, got {args.parity_rows}")
    if not args.parity_tol >= 0:
        raise InputError(f"--parity-tol must be >= 0, got {args.parity_tol}")
    if args.keep is not None and args.keep < 1:
        raise InputError(f"--keep must be >= 1, got {args.keep}")
    return ExportRequest(
        checkpoint=checkpoint,
        feature_spec=spec,
        repo=args.repo,
        target=resolve_target(args.target, args.target_ops),
        val_features=_default(args.val_features, args.run, "val_features.npy", False),
        metrics=_default(None, args.run, "metrics.json", False),
        version=args.version,
        keep=args.keep,
        opset=args.opset,
        torchscript=args.torchscript,
        parity_rows=args.parity_rows,
        parity_tol=args.parity_tol,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="export: %(message)s")
    try:
        req = request_from_args(args)
        from export.pipeline import export_version

        result = export_version(req)
    except (ExportError, OSError) as e:  # OSError: e.g. the disk filled up while writing the version
        print(f"export: error: {e}", file=sys.stderr)
        return 1
    p = result.parity
    print(f"published version {result.version} at {result.path} in {result.seconds:.1f} s")
    print(
        f"parity: {p['rows']} rows {p['groups']}, max abs diff {p['max_abs_diff']:.3g} <= {p['tolerance']:g} "
        f"({', '.join(f'{k} {v:.3g}' for k, v in p['max_abs_diff_by_pair'].items())})"
    )
    if result.removed_versions:
        print(f"retention: removed versions {result.removed_versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
