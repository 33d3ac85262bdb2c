"""Checkpoint -> calibrator -> patched ONNX -> SavedModel (+ TorchScript) -> parity gates -> published version."""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ctr_contract.manifest import file_hashes
from ctr_contract.repository import (
    ASSETS_EXTRA,
    CALIBRATION_PATH,
    DRIFT_REFERENCE_PATH,
    FEATURE_RANGES_PATH,
    FEATURE_SPEC_PATH,
    MANIFEST_PATH,
    ONNX_MODEL,
    RAW_ONNX_MODEL,
    TORCHSCRIPT_MODEL,
    WARMUP_PATH,
)
from ctr_contract.run_dir import RELIABILITY_PLOT
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_contract.signatures import DEFAULT_SIGNATURE, OUTPUT_NAMES, RAW_SIGNATURE
from ctr_contract.stage_trace import stage as trace_stage
from ctr_features.compiled.onnx_graph import raw_ops
from ctr_features.parity import build_raw_rows
from ctr_features.spec import FeatureSpec
from ctr_model.checkpoint import load_net
from ctr_model.errors import CheckpointError
from ctr_model.net import CTRNet
from export import calibration
from export.errors import InputError
from export.gates.gate import calibration_summary, gate_export
from export.gates.parity import build_rows, run_gate, saturation
from export.gates.raw_parity import (
    load_val_raw,
    onnxruntime_raw_predictor,
    python_predictor,
    run_raw_gate,
    savedmodel_raw_predictor,
    serving_predictor,
)
from export.gates.runtimes import (
    onnxruntime_predictor,
    savedmodel_predictor,
    torch_predictor,
    torchscript_predictor,
    write_torchscript,
)
from export.onnx.onnx_export import BATCH_DIM, INPUT_NAME, check_target_ops, export_onnx
from export.onnx.patches import apply_patches
from export.publish.bucket import BucketRepository, open_repository
from export.publish.drift_reference import write_reference
from export.publish.feature_ranges import write_ranges
from export.publish.manifest import build_manifest, read_metrics, write_manifest
from export.publish.repository import ModelRepository
from export.raw_graphs import build_raw_model
from export.request import ExportRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportResult:
    """Where the version went and what the gate measured."""

    version: int
    path: Path | str  # the version folder, or its s3:// URL
    seconds: float
    parity: dict[str, Any]
    removed_versions: list[int]
    quality_gate: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = None  # the calibrator and its report (manifest.json's `calibration`)


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
    net_width = net.cfg.width
    if net_width != width:
        raise InputError(
            f"checkpoint {req.checkpoint} takes {net_width} features but feature spec {req.feature_spec} "
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


def load_spec(path: Path) -> FeatureSpec:
    """The FeatureSpec the raw graphs apply; a spec this code cannot read fails before any slow step."""
    try:
        return FeatureSpec.load(path)
    except ValueError as e:
        raise InputError(f"{e}; retrain with this version of training to export the raw signature") from e


def raw_io(raw_proto: onnx.ModelProto) -> dict[str, Any]:
    """The manifest's description of the `raw` signature."""
    return {
        "signature": RAW_SIGNATURE,
        "onnx_file": RAW_ONNX_MODEL,
        "inputs": {
            **{f: {"dtype": "float64", "shape": [-1], "missing": "NaN"} for f in NUMERIC_FIELDS},
            **{f: {"dtype": "string", "shape": [-1], "missing": ""} for f in CATEGORICAL_FIELDS},
        },
        "outputs": {name: {"dtype": "float32", "shape": [-1, 1]} for name in OUTPUT_NAMES},
        "onnx_ops": raw_ops(raw_proto),
    }


def export_version(req: ExportRequest) -> ExportResult:
    """Run the whole export; on any error nothing is published and the staging folder is removed."""
    started = time.perf_counter()
    repo = open_repository(req.repo)
    try:
        repo.prepare()  # first: a wrong path or wrong credentials fail before any slow step
        return _export(req, repo, started)
    finally:
        repo.close()


def _export(req: ExportRequest, repo: ModelRepository | BucketRepository, started: float) -> ExportResult:
    with trace_stage("prepare"):
        net, ckpt, width, val = load_inputs(req)
    if val is None:  # before the slow steps: every version carries its drift reference
        raise InputError(
            f"no validation rows: the version would have no {DRIFT_REFERENCE_PATH}, so the server could not "
            f"export drift metrics for it; give --val-features FILE (the run's val_features.npy) or --run DIR"
        )
    spec = load_spec(req.feature_spec)
    metrics = read_metrics(req.metrics)  # read before the slow steps: a bad file fails fast
    w = calibration.negative_rate(ckpt, metrics)
    fitted = calibration.fit(req.calibration, net, *calibration.held_out(req, val), w)
    calibrator = fitted.calibrator
    if req.run is not None and fitted.report_labels is not None:
        from export.publish.reliability import write_reliability  # matplotlib: only to draw

        assert fitted.report_before is not None and fitted.report_after is not None
        try:
            write_reliability(
                req.run / RELIABILITY_PLOT,
                fitted.report_labels,
                fitted.report_before,
                fitted.report_after,
                calibration.after_label(fitted),
            )
        except OSError as e:  # a read-only run folder (the k8s export Job mounts it so): the figures stay
            log.warning(
                "cannot write %s (%s); the calibration figures are in the version's manifest",
                RELIABILITY_PLOT,
                e,
            )
    with trace_stage("quality_gate"):
        # Before the slow steps: a refusal costs seconds.
        quality = gate_export(req, net, metrics, calibrator, served_dir=repo.newest_local())
    version = repo.choose_version(req.version)
    with repo.staging(version) as stage:
        patched, applied = apply_patches(net, req.target.ops)
        for p in applied:
            log.info("patched %s: %s -> %s", p.module, p.op, p.replacement)
        with trace_stage("onnx"):
            proto = export_onnx(patched, width, stage / ONNX_MODEL, req.opset, calibrator)
        ops_used = check_target_ops(proto, req.target)

        raw_proto = build_raw_model(proto, spec)  # the `raw` signature: FeatureSpec nodes + the model graph
        onnx.save(raw_proto, stage / RAW_ONNX_MODEL)

        from export.raw_graphs import save_saved_model_with_raw  # TensorFlow loads only once ONNX passed

        with trace_stage("savedmodel"):
            save_saved_model_with_raw(proto, spec, stage)
        # The unpatched model and its calibrator are the reference; every backend gives ctr and raw_score.
        backends = {"pytorch": torch_predictor(net, calibrator, outputs=OUTPUT_NAMES)}
        if req.torchscript:
            write_torchscript(net, width, stage / TORCHSCRIPT_MODEL, calibrator)
            backends["torchscript"] = torchscript_predictor(stage / TORCHSCRIPT_MODEL, outputs=OUTPUT_NAMES)
        backends["onnxruntime"] = onnxruntime_predictor(stage / ONNX_MODEL, outputs=OUTPUT_NAMES)
        backends["savedmodel"] = savedmodel_predictor(stage, outputs=OUTPUT_NAMES)

        rows = build_rows(net, width, req.parity_rows, val)
        with trace_stage("parity", rows=len(rows.features)):
            report = run_gate(rows, backends, req.parity_tol)
        report["saturation"] = saturation(net, rows.features)
        from export.tf.warmup import WARMUP_BATCHES, write_warmup  # TensorFlow again: after the ONNX steps

        val_raw = load_val_raw(req.val_raw)
        raw_rows, raw_groups = build_raw_rows(spec, req.parity_rows, val_raw)
        raw_backends = {
            "python": python_predictor(spec, backends["pytorch"]),
            "onnxruntime_raw": onnxruntime_raw_predictor(stage / RAW_ONNX_MODEL, outputs=OUTPUT_NAMES),
            "savedmodel_raw": savedmodel_raw_predictor(stage, outputs=OUTPUT_NAMES),
            "serving_transform": serving_predictor(spec, backends["onnxruntime"]),
        }
        with trace_stage("raw_parity"):
            report[RAW_SIGNATURE] = run_raw_gate(spec, raw_rows, raw_groups, raw_backends, req.parity_tol)
        warm_raw = (raw_rows[0][: max(WARMUP_BATCHES)], raw_rows[1][: max(WARMUP_BATCHES)])
        expected = np.asarray(raw_backends["python"](*warm_raw)).reshape(len(warm_raw[0]), len(OUTPUT_NAMES))
        raw_expected = {name: expected[:, [j]] for j, name in enumerate(OUTPUT_NAMES)}  # the load gate's

        (stage / ASSETS_EXTRA).mkdir()
        shutil.copyfile(req.feature_spec, stage / FEATURE_SPEC_PATH)
        calibration.write_json(stage / CALIBRATION_PATH, fitted)
        if not write_reference(  # drift watches the served score: ctr
            stage / DRIFT_REFERENCE_PATH, req.train_features, val, torch_predictor(net, calibrator), val_raw
        ):
            raise InputError(f"{DRIFT_REFERENCE_PATH} could not be written")  # no rows: refused above
        write_ranges(stage / FEATURE_RANGES_PATH, req.train_features, val)
        warm_rows = val if val is not None and len(val) >= 64 else rows.features
        write_warmup(
            stage / WARMUP_PATH, warm_rows, repo.name, INPUT_NAME, DEFAULT_SIGNATURE, warm_raw, raw_expected
        )
        io = {
            "signature": DEFAULT_SIGNATURE,
            "inputs": {
                INPUT_NAME: {"dtype": "float32", "shape": [-1, width], "onnx_shape": [BATCH_DIM, width]}
            },
            "outputs": {
                name: {"dtype": "float32", "shape": [-1, 1], "onnx_shape": [BATCH_DIM, 1]}
                for name in OUTPUT_NAMES
            },
            RAW_SIGNATURE: raw_io(raw_proto),
        }
        files = file_hashes(stage)
        version = repo.claim(req.version, version)  # a bucket's number is taken only now, after the gates
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
            quality_gate=quality,
            calibration=fitted.to_dict(),
        )
        write_manifest(stage / MANIFEST_PATH, manifest)
        with trace_stage("publish", version=version):
            final = repo.publish(stage, version)
    repo.write_triton_config(width, INPUT_NAME, OUTPUT_NAMES)
    removed = repo.retain(req.keep, protect=version) if req.keep else []
    if req.run is not None and req.metrics is not None:
        calibration.record_in_metrics(req.metrics, metrics_figures(fitted.to_dict(), quality, version))
    seconds = time.perf_counter() - started
    return ExportResult(version, final, seconds, report, removed, quality, fitted.to_dict())


def metrics_figures(cal: dict[str, Any], quality: dict[str, Any] | None, version: int) -> dict[str, Any]:
    """What export adds to RUN/metrics.json: the calibrator, its before/after figures and the gate's."""
    report = cal.get("report") or {}
    cand = (quality or {}).get("candidate") or {}
    return {
        "version": version,
        "method": cal.get("method"),
        "negative_rate": cal.get("negative_rate"),
        "before": report.get("before"),
        "after": report.get("after"),
        "gate": {k: cand.get(k) for k in ("auc", "ece", "calibration_ratio", "field_calibration")}
        if cand
        else None,
        "summary": calibration_summary(cand) if cand else None,
    }
