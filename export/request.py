"""What one export is asked to do: `ExportRequest`, whose defaults are also the CLI's (`python -m export`)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from ctr_model.calibration import METHODS
from export.gates.parity import MIN_ROWS
from export.onnx.targets import DEFAULT_PROFILE, PROFILES, Target

DEFAULT_REPO = Path("artifacts/models/ctr")
DEFAULT_TARGET = Target(DEFAULT_PROFILE, PROFILES[DEFAULT_PROFILE])


@dataclass(frozen=True)
class ExportRequest:
    """Everything one export needs; built by the CLI from its options."""

    checkpoint: Path
    feature_spec: Path
    repo: Path | str = (
        DEFAULT_REPO  # a local base path, or an s3://BUCKET/PREFIX URL (export/publish/bucket.py)
    )
    target: Target = DEFAULT_TARGET
    val_features: Path | None = None
    metrics: Path | None = None
    version: int | None = None
    keep: int | None = None
    opset: int = 17
    torchscript: bool = True
    parity_rows: int = MIN_ROWS
    parity_tol: float = 1e-5
    # The quality gate (export/gates/gate.py) and the drift reference (export/publish/drift_reference.py).
    val_labels: Path | None = None
    train_features: Path | None = None
    eval_data: Path | None = None
    max_auc_drop: float = 0.002
    max_ece_rise: float = 0.01
    max_calibration_gap: float = 0.05  # refuse a calibration ratio outside [1 - gap, 1 + gap]
    force: bool = False
    # Raw validation rows for the raw-signature parity gate (export/gates/raw_parity.py).
    val_raw: Path | None = None
    # The calibrator (export/calibration.py): a METHODS name, fitted on val_features + val_labels.
    calibration: str = METHODS[0]
    calibration_data: Path | None = None  # Criteo rows to fit it on instead (the online loop's held-out rows)
    # The training run dir (--run), where export writes reliability.png and its figures into metrics.json.
    run: Path | None = None


def request_defaults() -> dict[str, Any]:
    """The default of every ExportRequest field that has one, by field name (the CLI's defaults)."""
    return {f.name: f.default for f in fields(ExportRequest) if f.default is not MISSING}
