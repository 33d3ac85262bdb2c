"""The quality gate: a candidate is published only when it is not worse than the version being served.

Both models score the same held-out rows, each through its own feature spec:
- `--eval-data FILE` (Criteo rows, text or Parquet, e.g. tomorrow's first hours or an interval's held-out
  partition): its first MAX_EVAL_ROWS rows (export/gates/eval_rows.py);
- by default the run's validation split: RUN/val_features.npy with RUN/val_labels.npy when the served version
  has the candidate's spec (a warm start keeps it frozen), else the validation rows of the run's data file.

The candidate is scored as it will be served: the network and its calibrator (`ctr`). The served version is
the newest published one. The gate refuses when the candidate's calibration ratio (mean predicted CTR /
observed CTR) is outside [1 - G, 1 + G] (`--max-calibration-gap G`) and the gap is beyond the click count's
noise (|calibration z| > CALIBRATION_Z), whether or not a version is served; and, against the served
version, when its AUC is more than `--max-auc-drop` below, or its expected calibration error (ECE) more than
`--max-ece-rise` above. ECE: rows sorted by prediction into 10 bins of equal size, then the row-weighted mean
of |mean prediction - observed click rate| per bin (ctr_model.metrics). Beside them: the field-level
calibration error (the worst of the 26 categorical fields over its top values) where the rows' raw values are
at hand, and the uncalibrated score's figures. `--force` publishes a refused candidate and the manifest says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctr_contract import repository
from ctr_contract.schema import CATEGORICAL_FIELDS
from ctr_contract.signatures import OUTPUT_NAMES
from ctr_model.calibration import Calibrator
from ctr_model.metrics import (
    calibration_ratio,
    expected_calibration_error,
    field_calibration_error,
    log_loss,
    roc_auc,
)
from export.errors import ExportError, InputError
from export.gates.eval_rows import EvalRows, rows_from_file, rows_from_run, spec_doc
from export.gates.runtimes import NO_CALIBRATION, onnxruntime_predictor, torch_predictor
from export.request import ExportRequest

# The calibration z-test: z = (sum p - sum y) / sqrt(sum p (1 - p)), the clicks' surplus of prediction in
# standard deviations of the click count a calibrated model would see. On 2,000 rows at a 25% click rate one sd
# is ~4% of the clicks, so a ratio gap alone would refuse calibrated candidates; on 50,000 rows a 5% gap is z ~ 9.
CALIBRATION_Z = 3.0
log = logging.getLogger(__name__)

Scorer = Callable[[np.ndarray], np.ndarray]  # float32 (N, width) -> ctr (N, 1), or ctr and raw_score (N, 2)


class GateError(ExportError):
    """The candidate scored worse than the served version; nothing was published."""


def figures(labels: np.ndarray, probs: np.ndarray, categorical: np.ndarray | None = None) -> dict[str, Any]:
    """AUC, log loss, ECE, calibration ratio, mean predicted and observed CTR of one model on the rows, and
    the field-level calibration error when the rows' raw categorical values (N, 26) are given."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    both = 0 < y.sum() < len(y)
    out: dict[str, Any] = {
        "auc": roc_auc(y, p) if both else None,  # AUC needs both classes
        "logloss": log_loss(y, p),
        "ece": expected_calibration_error(y, p),
        "calibration_ratio": calibration_ratio(y, p),
        "calibration_z": calibration_z(y, p),
        "mean_predicted_ctr": float(p.mean()),
        "observed_ctr": float(y.mean()),
    }
    if categorical is not None:
        try:
            out["field_calibration"] = field_calibration_error(y, p, categorical, CATEGORICAL_FIELDS)
        except ValueError as e:  # no field has a value with enough rows
            out["field_calibration"] = {"unavailable": str(e)}
    return out


def calibration_z(labels: np.ndarray, probs: np.ndarray) -> float:
    """(sum p - sum y) / sqrt(sum p (1 - p)): how many standard deviations of the click count (a sum of
    Bernoulli(p)) the predicted clicks exceed the observed ones by; inf (signed) when the variance is 0."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    gap = float(p.sum() - np.asarray(labels, dtype=np.float64).sum())
    sd = float(np.sqrt((p * (1.0 - p)).sum()))
    return gap / sd if sd > 0 else (0.0 if gap == 0 else math.copysign(math.inf, gap))


def check_quality(
    candidate: Scorer,
    candidate_spec: Path,
    served_dir: Path | None,
    served: Scorer | None,
    rows: EvalRows,
    max_auc_drop: float,
    max_ece_rise: float,
    force: bool,
    max_calibration_gap: float = 0.05,
) -> dict[str, Any]:
    """Score both models on `rows`; raise GateError on a worse or miscalibrated candidate unless `force`.

    Args:
        candidate: the candidate's scorer (network and calibrator: ctr, then raw_score when it gives two
            columns); candidate_spec its feature_spec.json.
        served_dir, served: the newest published version folder and its scorer; None before the first publish.
    Returns:
        the report that goes into the manifest under "quality_gate".
    """
    scores = np.asarray(candidate(rows.features_for(candidate_spec)))
    scores = scores.reshape(len(rows.labels), -1)
    cand = figures(rows.labels, scores[:, 0], rows.categorical)
    if rows.categorical is None:
        cand["field_calibration"] = {"unavailable": rows.no_categorical}
    lo, hi = 1.0 - max_calibration_gap, 1.0 + max_calibration_gap
    report: dict[str, Any] = {
        "eval_rows": rows.source,
        "rows": len(rows.labels),
        "max_auc_drop": max_auc_drop,
        "max_ece_rise": max_ece_rise,
        "max_calibration_gap": max_calibration_gap,
        "calibration_ratio_range": [lo, hi],
        "calibration_z_limit": CALIBRATION_Z,
        "candidate": cand,
        "candidate_uncalibrated": figures(rows.labels, scores[:, 1]) if scores.shape[1] > 1 else None,
        "served": None,
        "reasons": [],
        "passed": True,
        "forced": False,
    }
    reasons = []
    z = cand["calibration_z"]
    if not lo <= cand["calibration_ratio"] <= hi and not abs(z) <= CALIBRATION_Z:
        reasons.append(
            f"calibration ratio {cand['calibration_ratio']:.4f} (mean predicted CTR "
            f"{cand['mean_predicted_ctr']:.4f} / observed {cand['observed_ctr']:.4f}) is outside [{lo:g}, {hi:g}] "
            f"(--max-calibration-gap {max_calibration_gap:g}) by more than the clicks' noise (calibration z "
            f"{z:.1f}, beyond ±{CALIBRATION_Z:g})"
        )
    if served_dir is None or served is None:
        return _decide(report, reasons, rows, force)  # the first version has nothing to be compared with
    version = int(served_dir.name)
    try:
        old_probs = served(rows.features_for(served_dir / repository.FEATURE_SPEC_PATH))
    except InputError:
        raise
    except Exception as e:  # ONNX Runtime raises its own types for a model it cannot run on these rows
        raise InputError(f"the quality gate cannot score version {version} ({served_dir}): {e}") from e
    old = figures(rows.labels, old_probs)
    report["served"] = {"version": version, **old}
    if cand["auc"] is not None and old["auc"] is not None and cand["auc"] < old["auc"] - max_auc_drop:
        reasons.append(
            f"AUC {cand['auc']:.4f} is {old['auc'] - cand['auc']:.4f} below version {version}'s {old['auc']:.4f} "
            f"(--max-auc-drop {max_auc_drop:g})"
        )
    if cand["ece"] > old["ece"] + max_ece_rise:
        reasons.append(
            f"ECE {cand['ece']:.4f} is {cand['ece'] - old['ece']:.4f} above version {version}'s {old['ece']:.4f} "
            f"(--max-ece-rise {max_ece_rise:g}; mean predicted CTR {cand['mean_predicted_ctr']:.4f}, "
            f"observed {cand['observed_ctr']:.4f})"
        )
    return _decide(report, reasons, rows, force)


def calibration_summary(fig: dict[str, Any]) -> str:
    """ECE, calibration ratio and the field-level error of one model's figures, in words."""
    text = f"ECE {fig['ece']:.4f}, calibration ratio {fig['calibration_ratio']:.4f}"
    if "calibration_z" in fig:
        text += f" (z {fig['calibration_z']:.1f})"
    field = fig.get("field_calibration")
    if field and "field" in field:
        text += (
            f", field calibration error {field['value_error']:.4f} (worst field {field['field']}, value "
            f"{field['worst_value']!r}, {field['rows']} rows)"
        )
    elif field:
        text += (
            f", field calibration error unavailable: {field.get('unavailable', 'no field has enough rows')}"
        )
    return text


def _decide(report: dict[str, Any], reasons: list[str], rows: EvalRows, force: bool) -> dict[str, Any]:
    report["reasons"], report["passed"], report["forced"] = reasons, not reasons, bool(reasons) and force
    if reasons and not force:
        raise GateError(
            f"quality gate refused the candidate on {rows.source}: {'; '.join(reasons)} (candidate: "
            f"{calibration_summary(report['candidate'])}); nothing was published (--force publishes anyway)"
        )
    return report


def gate_export(
    req: ExportRequest,
    net: torch.nn.Module,
    metrics: dict[str, Any] | None,
    calibrator: Calibrator = NO_CALIBRATION,
    *,
    served_dir: Path | None,
) -> dict[str, Any]:
    """Run the gate for one export request: the candidate `net` with its `calibrator` against the newest
    published version, `served_dir` (its local folder, named by its number; None before the first publish).

    Without held-out rows that both models can score (no --eval-data, and a run without val_labels.npy or
    data file) the gate fails closed: with a version served it raises InputError, unless `--force`, which
    publishes with a warning and the manifest's quality_gate says why. The first version has nothing to beat.
    """
    rows, why_not = _eval_rows(req, metrics, served_dir)
    if rows is None:
        if served_dir is not None and not req.force:
            raise InputError(
                f"the quality gate cannot compare the candidate with version {served_dir.name}: {why_not}; "
                "nothing was published (--force publishes without the gate)"
            )
        log.warning("quality gate skipped: %s", why_not)
        forced = served_dir is not None
        return {"skipped": why_not, "passed": None, "forced": forced, "candidate": None, "served": None}
    served = None
    if served_dir is not None:
        try:
            served = onnxruntime_predictor(served_dir / repository.ONNX_MODEL)
        except Exception as e:  # a missing or corrupt model.onnx: ONNX Runtime's own exception types
            raise InputError(f"the quality gate cannot load version {served_dir.name}'s model: {e}") from e
    return check_quality(
        torch_predictor(net, calibrator, outputs=OUTPUT_NAMES),
        req.feature_spec,
        served_dir,
        served,
        rows,
        req.max_auc_drop,
        req.max_ece_rise,
        req.force,
        req.max_calibration_gap,
    )


def _eval_rows(
    req: ExportRequest, metrics: dict[str, Any] | None, served_dir: Path | None
) -> tuple[EvalRows | None, str]:
    """The held-out rows, or None and the reason there are none."""
    if req.eval_data is not None:
        return rows_from_file(req.eval_data), ""
    same_spec = served_dir is None or spec_doc(served_dir / repository.FEATURE_SPEC_PATH) == spec_doc(
        req.feature_spec
    )
    if same_spec and req.val_features is not None and req.val_labels is not None and req.val_labels.is_file():
        return rows_from_run(req.val_features, req.val_labels, req.feature_spec, req.val_raw), ""
    config = (metrics or {}).get("config") or {}
    data = Path(str(config.get("data", "")))
    if config.get("data") and data.is_file() and isinstance(config.get("val_fraction"), float):
        return rows_from_file(data, val_fraction=config["val_fraction"]), ""
    if not same_spec:
        return None, (
            f"version {served_dir.name if served_dir else '?'} has another feature spec and the run's data file "
            "is not at hand; give --eval-data FILE (raw Criteo rows) to compare them"
        )
    return None, "the run has no val_labels.npy and no data file; give --eval-data FILE (Criteo rows)"
