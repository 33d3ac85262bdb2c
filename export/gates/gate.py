"""The quality gate: a candidate is published only when it is not worse than the version being served.

Both models score the same held-out rows, each through its own feature spec:
- `--eval-data FILE` (a Criteo file, e.g. tomorrow's first hours): its first MAX_EVAL_ROWS rows;
- by default the run's validation split: RUN/val_features.npy with RUN/val_labels.npy when the served version
  has the candidate's spec (a warm start keeps it frozen), else the validation rows of the run's data file.

The served version is the newest published one. The gate refuses when the candidate's AUC is more than
`--max-auc-drop` below the served version's, or when its expected calibration error (ECE) is more than
`--max-ece-rise` above it. ECE: rows sorted by prediction into ECE_BINS bins of equal size, then the
row-weighted mean of |mean prediction - observed click rate| per bin. Mean predicted CTR against observed CTR
is reported beside it. `--force` publishes a refused candidate and the manifest says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ctr_contract import repository
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.data.criteo import read_batches
from ctr_features.data.split import validation_mask
from ctr_features.spec import FeatureSpec
from ctr_model.metrics import log_loss, roc_auc
from export.errors import ExportError, InputError
from export.gates.runtimes import onnxruntime_predictor, torch_predictor
from export.request import ExportRequest

ECE_BINS = 10
MAX_EVAL_ROWS = 100_000
log = logging.getLogger(__name__)

Scorer = Callable[[np.ndarray], np.ndarray]  # float32 (N, width) -> ctr (N, 1)


class GateError(ExportError):
    """The candidate scored worse than the served version; nothing was published."""


@dataclass(frozen=True)
class EvalRows:
    """Held-out rows: labels float [N], and the features a given feature spec makes of them."""

    source: str
    labels: np.ndarray
    features_for: Callable[[Path], np.ndarray]  # feature_spec.json -> float32 (N, width)


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, bins: int = ECE_BINS) -> float:
    """Row-weighted mean |mean(prob) - mean(label)| over `bins` equal-size bins of rows sorted by prob."""
    order = np.argsort(probs, kind="mergesort")
    gaps = [
        abs(float(probs[part].mean()) - float(labels[part].mean())) * len(part)
        for part in np.array_split(order, bins)
        if len(part)
    ]
    return float(sum(gaps) / len(probs))


def figures(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """AUC, log loss, ECE, mean predicted and observed CTR of one model on the rows."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    return {
        "auc": roc_auc(y, p),
        "logloss": log_loss(y, p),
        "ece": expected_calibration_error(y, p),
        "mean_predicted_ctr": float(p.mean()),
        "observed_ctr": float(y.mean()),
    }


def rows_from_run(val_features: Path, val_labels: Path, candidate_spec: Path) -> EvalRows:
    """The run's validation rows, already transformed with the candidate's spec."""
    try:
        x = np.load(val_features, allow_pickle=False).astype(np.float32)
        y = np.load(val_labels, allow_pickle=False).astype(np.float64)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the gate's validation rows: {e}") from e
    if len(x) != len(y):
        raise InputError(f"{val_features} has {len(x)} rows but {val_labels} has {len(y)} labels")
    spec_text = _spec_doc(candidate_spec)

    def features_for(spec: Path) -> np.ndarray:
        if _spec_doc(spec) != spec_text:
            raise InputError(
                f"the served version's feature spec {spec} differs from the candidate's, so {val_features} "
                "cannot score it; give --eval-data FILE (raw Criteo rows) or train with a data file"
            )
        return x

    return EvalRows(f"{val_features} ({len(y)} validation rows)", y, features_for)


def rows_from_file(path: Path, val_fraction: float | None = None, max_rows: int = MAX_EVAL_ROWS) -> EvalRows:
    """Raw Criteo rows of `path` (only its validation split when `val_fraction` is given), at most `max_rows`."""
    numeric: list[np.ndarray] = []
    categorical: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    kept = 0
    try:
        for batch in read_batches(path):
            table = pa.Table.from_batches([batch])
            if val_fraction is not None:
                table = table.filter(
                    pa.array(validation_mask(table.column("row_id").to_numpy(), val_fraction))
                )
            table = table.slice(0, max_rows - kept)
            numeric.append(
                np.stack([table.column(f).to_numpy(zero_copy_only=False) for f in NUMERIC_FIELDS], 1).astype(
                    np.float64
                )
            )
            categorical.append(
                np.stack([np.asarray(table.column(f).to_pylist(), object) for f in CATEGORICAL_FIELDS], 1)
            )
            labels.append(table.column("label").to_numpy().astype(np.float64))
            kept += len(table)
            if kept >= max_rows:
                break
    except (OSError, ValueError) as e:  # MalformedRowError is a ValueError
        raise InputError(f"cannot read --eval-data {path}: {e}") from e
    if kept == 0:
        raise InputError(f"--eval-data {path} holds no rows to score")
    num, cat = np.concatenate(numeric), np.concatenate(categorical)
    what = "validation rows" if val_fraction is not None else "rows"

    def features_for(spec: Path) -> np.ndarray:
        return FeatureSpec.load(spec).transform(num, cat)

    return EvalRows(f"{path} ({kept} {what})", np.concatenate(labels), features_for)


def check_quality(
    candidate: Scorer,
    candidate_spec: Path,
    served_dir: Path | None,
    served: Scorer | None,
    rows: EvalRows,
    max_auc_drop: float,
    max_ece_rise: float,
    force: bool,
) -> dict[str, Any]:
    """Score both models on `rows`; raise GateError on a worse candidate unless `force`.

    Args:
        candidate: the candidate network's scorer; candidate_spec its feature_spec.json.
        served_dir, served: the newest published version folder and its scorer; None before the first publish.
    Returns:
        the report that goes into the manifest under "quality_gate".
    """
    cand = figures(rows.labels, candidate(rows.features_for(candidate_spec)))
    report: dict[str, Any] = {
        "eval_rows": rows.source,
        "rows": len(rows.labels),
        "max_auc_drop": max_auc_drop,
        "max_ece_rise": max_ece_rise,
        "candidate": cand,
        "served": None,
        "reasons": [],
        "passed": True,
        "forced": False,
    }
    if served_dir is None or served is None:
        return report  # the first version has nothing to be compared with
    version = int(served_dir.name)
    try:
        old_probs = served(rows.features_for(served_dir / repository.FEATURE_SPEC_PATH))
    except InputError:
        raise
    except Exception as e:  # ONNX Runtime raises its own types for a model it cannot run on these rows
        raise InputError(f"the quality gate cannot score version {version} ({served_dir}): {e}") from e
    old = figures(rows.labels, old_probs)
    report["served"] = {"version": version, **old}
    reasons = []
    if cand["auc"] < old["auc"] - max_auc_drop:
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
    report["reasons"], report["passed"], report["forced"] = reasons, not reasons, bool(reasons) and force
    if reasons and not force:
        raise GateError(
            f"quality gate refused the candidate on {rows.source}: {'; '.join(reasons)}; nothing was published "
            "(--force publishes anyway)"
        )
    return report


def _spec_doc(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read feature spec {path}: {e}") from e


def gate_export(req: ExportRequest, net: torch.nn.Module, metrics: dict[str, Any] | None) -> dict[str, Any]:
    """Run the gate for one export request: the candidate `net` against the newest published version.

    Without held-out rows that both models can score (no --eval-data, and a run without val_labels.npy or
    data file) the gate fails closed: with a version served it raises InputError, unless `--force`, which
    publishes with a warning and the manifest's quality_gate says why. The first version has nothing to beat.
    """
    versions = repository.version_dirs(req.repo) if req.repo.is_dir() else {}
    served_dir = versions[max(versions)] if versions else None
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
        torch_predictor(net),
        req.feature_spec,
        served_dir,
        served,
        rows,
        req.max_auc_drop,
        req.max_ece_rise,
        req.force,
    )


def _eval_rows(
    req: ExportRequest, metrics: dict[str, Any] | None, served_dir: Path | None
) -> tuple[EvalRows | None, str]:
    """The held-out rows, or None and the reason there are none."""
    if req.eval_data is not None:
        return rows_from_file(req.eval_data), ""
    same_spec = served_dir is None or _spec_doc(served_dir / repository.FEATURE_SPEC_PATH) == _spec_doc(
        req.feature_spec
    )
    if same_spec and req.val_features is not None and req.val_labels is not None and req.val_labels.is_file():
        return rows_from_run(req.val_features, req.val_labels, req.feature_spec), ""
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
