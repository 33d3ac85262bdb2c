"""Checkpoint -> patched ONNX -> SavedModel (+ TorchScript) -> parity gate -> published version."""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from export.errors import InputError
from export.manifest import build_manifest, read_metrics, sha256, write_manifest
from export.onnx_export import BATCH_DIM, INPUT_NAME, OUTPUT_NAME, check_target_ops, export_onnx
from export.parity import MIN_ROWS, build_rows, run_gate, saturation
from export.patches import apply_patches
from export.repository import ModelRepository
from export.runtimes import (
    onnxruntime_predictor,
    savedmodel_predictor,
    torch_predictor,
    torchscript_predictor,
    write_torchscript,
)
from export.targets import Target
from training.checkpoint import CheckpointError, load_net
from training.model import CTRNet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportRequest:
    """Everything one export needs; built by the CLI from its options."""

    checkpoint: Path
    feature_spec: Path
    repo: Path
    target: Target
    val_features: Path | None = None
    metrics: Path | None = None
    version: int | None = None
    keep: int | None = None
    opset: int = 17
    torchscript: bool = True
    parity_rows: int = MIN_ROWS
    parity_tol: float = 1e-5


@dataclass(frozen=True)
class ExportResult:
    """Where the version went and what the gate measured."""

    version: int
    path: Path
    seconds: float
    parity: dict[str, Any]
    removed_versions: list[int]


def spec_width(path: Path) -> int:
    """The output width of a feature_spec.json; the rest of the spec is copied into the version unread."""
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read feature spec {path}: {e}") from e
    width = spec.get("width") if isinstance(spec, dict) else None
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise InputError(
            f"feature spec {path} has width {width!r}; expected a positive integer under 'width'"
        )
    return width


def load_inputs(req: ExportRequest) -> tuple[CTRNet, dict[str, Any], int, np.ndarray | None]:
    """Load and cross-check checkpoint, feature spec and validation rows.

    Returns:
        (eval net, checkpoint dict, feature width, validation rows (V, width) or None).
    """
    try:
        net, ckpt = load_net(req.checkpoint)
    except CheckpointError as e:
        raise InputError(str(e)) from e
    width = spec_width(req.feature_spec)
    in_features = net.cfg.in_features
    if in_features != width:
        raise InputError(
            f"checkpoint {req.checkpoint} takes {in_features} features but feature spec {req.feature_spec} "
            f"produces {width}; export a checkpoint trained with this spec"
        )
    val = None
    if req.val_features is not None:
        try:
            val = np.load(req.val_features, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read validation rows {req.val_features}: {e}") from e
        if val.ndim != 2 or val.shape[1] != width or not np.all(np.isfinite(val)):
            raise InputError(
                f"validation rows {req.val_features} have shape {list(val.shape)}; expected finite float32 [N, {width}]"
            )
        val = val.astype(np.float32)
    return net, ckpt, width, val


def export_version(req: ExportRequest) -> ExportResult:
    """Run the whole export; on any error nothing is published and the staging folder is removed."""
    started = time.perf_counter()
    net, ckpt, width, val = load_inputs(req)
    metrics = read_metrics(req.metrics)  # read before the slow steps: a bad file fails fast
    repo = ModelRepository(req.repo)
    repo.prepare()
    version = repo.choose_version(req.version)
    with repo.staging(version) as stage:
        patched, applied = apply_patches(net, req.target.ops)
        for p in applied:
            log.info("patched %s: %s -> %s", p.module, p.op, p.replacement)
        proto = export_onnx(patched, width, stage / "model.onnx", req.opset)
        ops_used = check_target_ops(proto, req.target)

        from export.translator import save_saved_model  # TensorFlow loads only once ONNX passed

        save_saved_model(proto, stage)
        backends = {"pytorch": torch_predictor(net)}  # the unpatched model is the reference
        if req.torchscript:
            write_torchscript(net, width, stage / "model.pt")
            backends["torchscript"] = torchscript_predictor(stage / "model.pt")
        backends["onnxruntime"] = onnxruntime_predictor(stage / "model.onnx")
        backends["savedmodel"] = savedmodel_predictor(stage)

        rows = build_rows(net, width, req.parity_rows, val)
        report = run_gate(rows, backends, req.parity_tol)
        report["saturation"] = saturation(net, rows.features)

        from export.warmup import write_warmup

        extra = stage / "assets.extra"
        extra.mkdir()
        shutil.copyfile(req.feature_spec, extra / "feature_spec.json")
        warm_rows = val if val is not None and len(val) >= 64 else rows.features
        write_warmup(
            extra / "tf_serving_warmup_requests", warm_rows, repo.name, INPUT_NAME, "serving_default"
        )
        io = {
            "signature": "serving_default",
            "inputs": {
                INPUT_NAME: {"dtype": "float32", "shape": [-1, width], "onnx_shape": [BATCH_DIM, width]}
            },
            "outputs": {OUTPUT_NAME: {"dtype": "float32", "shape": [-1, 1], "onnx_shape": [BATCH_DIM, 1]}},
        }
        files = {p.relative_to(stage).as_posix(): sha256(p) for p in sorted(stage.rglob("*")) if p.is_file()}
        manifest = build_manifest(
            version=version,
            checkpoint=req.checkpoint,
            ckpt=ckpt,
            metrics=metrics,
            io=io,
            opset=req.opset,
            target={"name": req.target.name, "ops": sorted(req.target.ops), "ops_used": ops_used},
            patches=[asdict(p) for p in applied],
            parity=report,
            files=files,
            export_seconds=time.perf_counter() - started,
        )
        write_manifest(extra / "manifest.json", manifest)
        final = repo.publish(stage, version)
    repo.write_triton_config(width, INPUT_NAME, OUTPUT_NAME)
    removed = repo.retain(req.keep, protect=version) if req.keep else []
    return ExportResult(version, final, time.perf_counter() - started, report, removed)
