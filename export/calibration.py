"""The calibrator every exported graph applies after the network, fitted on the run's held-out rows.

The network's logits z on `val_features.npy` and the labels in `val_labels.npy` (or on the Criteo rows of
`--calibration-data FILE`, through the candidate's spec) go to
`ctr_model.calibration.fit_calibrator`, with the run's negative sample rate w (training's
`--negative-sample-rate`, from the checkpoint's hyper_parameters or metrics.json; absent = 1.0, a run that
kept every negative). It fits on one half of the rows and reports on the other; the graphs then compute
ctr = calibrator(sigmoid(z + ln w)) beside raw_score = sigmoid(z). `--calibration none` keeps
ctr = sigmoid(z + ln w) and needs no labels. A held-out set the fit cannot use (too few rows, one class
only) or no labels at all is an InputError, one line, naming the way out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ctr_model.calibration import METHODS, Calibrator, fit_calibrator
from export.errors import InputError
from export.gates.eval_rows import rows_from_file
from export.request import ExportRequest

log = logging.getLogger(__name__)
NEGATIVE_RATE_KEY = "negative_sample_rate"  # training's name, in hyper_parameters and metrics.json
METRICS_KEY = "calibration"  # export's figures in RUN/metrics.json (the calibration part of the summary)


@dataclass(frozen=True)
class Calibration:
    """The fitted calibrator, its report, and the reporting half's labels and scores (for the diagram)."""

    calibrator: Calibrator
    report: dict[str, Any]
    report_labels: np.ndarray | None = None  # float64 (R,), the reporting half
    report_before: np.ndarray | None = None  # sigmoid(z + ln w) on it
    report_after: np.ndarray | None = None  # ctr on it

    def to_dict(self) -> dict[str, Any]:
        """What manifest.json's `calibration` and assets.extra/calibration.json hold."""
        return {**self.calibrator.to_dict(), "report": self.report}


def negative_rate(ckpt: dict[str, Any], metrics: dict[str, Any] | None) -> float:
    """The run's negative sample rate w in (0, 1]: the checkpoint's hyper_parameters, else metrics.json, else 1."""
    hp = ckpt.get("hyper_parameters") or {}
    for where, value in (
        ("the checkpoint (hyper_parameters)", hp.get(NEGATIVE_RATE_KEY)),
        ("metrics.json", (metrics or {}).get(NEGATIVE_RATE_KEY)),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise InputError(f"{where} gives {NEGATIVE_RATE_KEY} {value!r}; expected a number in (0, 1]")
        return float(value)
    return 1.0


def logits_of(net: nn.Module, features: np.ndarray) -> np.ndarray:
    """The network's logits z, float64 (N,), in batches under no_grad."""
    out = []
    with torch.no_grad():
        for s in range(0, len(features), 1 << 15):
            out.append(net(torch.from_numpy(features[s : s + (1 << 15)])).numpy().reshape(-1))
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


def load_labels(path: Path, rows: int, features: Path | None) -> np.ndarray:
    """0/1 labels float64 (rows,) from a .npy file that matches the validation rows one for one."""
    try:
        y = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read validation labels {path}: {e}") from e
    y = np.asarray(y, dtype=np.float64)
    y = y.reshape(-1) if y.ndim == 2 and y.shape[1:] == (1,) else y
    if y.ndim != 1 or len(y) != rows or not np.all((y == 0) | (y == 1)):
        raise InputError(
            f"validation labels {path} have shape {list(np.shape(y))}; expected {rows} labels of 0 or 1, one per "
            f"row of {features}"
        )
    return y


def held_out(req: ExportRequest, val: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, str]:
    """The rows the calibrator is fitted on: (features (N, width), 0/1 labels (N,) or None, where from).

    `--calibration-data FILE` (Criteo rows, text or Parquet: e.g. the online loop's held-out partition) when given, through the
    candidate's spec; else the validation rows and `--val-labels` (None when there are none).
    """
    if req.calibration_data is not None:
        rows = rows_from_file(req.calibration_data, flag="--calibration-data")
        return rows.features_for(req.feature_spec), rows.labels.astype(np.float64), rows.source
    if req.val_labels is None or not req.val_labels.is_file():
        return val, None, str(req.val_features)
    return val, load_labels(req.val_labels, len(val), req.val_features), str(req.val_labels)


def fit(
    method: str, net: nn.Module, features: np.ndarray, labels: np.ndarray | None, source: str, w: float
) -> Calibration:
    """Fit the calibrator `method` (METHODS) on `features` (N, width) and their 0/1 `labels` (from `source`).

    Raises:
        InputError: no labels (unless `none`), non-finite logits, or a held-out set the fit refuses
            (ctr_model.calibration.CalibrationDataError's message: too few rows, positives or negatives).
    """
    if method not in METHODS:
        raise InputError(f"--calibration {method!r} is not one of {list(METHODS)}")
    if labels is None:
        if method == "none":
            report = {"method": "none", "chosen_by": "requested", "fit_rows": 0, "report_rows": 0}
            return Calibration(Calibrator("none", negative_rate=w), report)
        raise InputError(
            f"the calibrator needs held-out labels and {source} has none (no --val-labels, and no val_labels.npy "
            "in the run or beside the feature spec); give --val-labels FILE (the run's val_labels.npy), --run "
            "DIR or --calibration-data FILE, or --calibration none to export without one"
        )
    z = logits_of(net, features)
    if not np.isfinite(z).all():
        bad = int(np.flatnonzero(~np.isfinite(z))[0])
        if method == "none":  # nothing to fit; the parity gate names the non-finite outputs
            report = {"method": "none", "chosen_by": "requested", "fit_rows": 0, "report_rows": 0}
            return Calibration(Calibrator("none", negative_rate=w), report)
        raise InputError(
            f"the network's logit on held-out row {bad} (labels: {source}) is {z[bad]}: the checkpoint gives "
            "non-finite scores (did training diverge?), so no calibrator can be fitted"
        )
    try:
        calibrator, report = fit_calibrator(z, labels, method=method, negative_rate=w, source=source)
    except ValueError as e:  # CalibrationDataError: too few rows or one class only
        raise InputError(str(e)) from e
    report = {"rows": source, **report}
    half = np.arange(len(z)) % 2 == 1  # fit_calibrator's reporting half (odd rows)
    before = 1.0 / (1.0 + np.exp(-(z[half] + math.log(w))))
    return Calibration(calibrator, report, labels[half], before, np.asarray(calibrator.apply(z[half])))


def after_label(calibration: Calibration) -> str:
    """The reliability diagram's name for the served calibrator's curve on the reporting half."""
    refit = calibration.report.get("refit_rows")
    method = calibration.calibrator.method
    return f"after ({method}, refit on all {refit} rows)" if refit else f"after ({method})"


def write_json(path: Path, calibration: Calibration) -> None:
    """assets.extra/calibration.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")


def record_in_metrics(path: Path, figures: dict[str, Any]) -> None:
    """Add export's calibration figures to RUN/metrics.json under METRICS_KEY (atomically; others kept)."""
    try:
        doc = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as e:
        log.warning("cannot add the calibration figures to %s: %s", path, e)
        return
    if not isinstance(doc, dict):
        return
    doc[METRICS_KEY] = figures
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a read-only run folder (the k8s export Job mounts it so): the version has them
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        log.warning(
            "cannot add the calibration figures to %s (%s); they are in the version's manifest", path, e
        )
