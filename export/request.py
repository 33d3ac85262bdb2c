"""What one export is asked to do: `ExportRequest`, whose defaults are also the CLI's (`python -m export`).

`python -m export` parses its options into one; a pipeline (the online trainer) builds one directly, most
simply with `ExportRequest.from_run`, and passes it to `export.pipeline.export_version`.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from ctr_contract import run_dir
from ctr_model.calibration import METHODS
from export.errors import InputError
from export.gates.parity import MIN_ROWS
from export.onnx.targets import DEFAULT_PROFILE, PROFILES, Target

DEFAULT_REPO = Path("artifacts/models/ctr")
DEFAULT_TARGET = Target(DEFAULT_PROFILE, PROFILES[DEFAULT_PROFILE])
# A run directory's optional files, by the ExportRequest field that takes each (from_run uses those present).
RUN_FILES = {
    "val_features": run_dir.VAL_FEATURES,
    "val_labels": run_dir.VAL_LABELS,
    "val_raw": run_dir.VAL_RAW,
    "train_features": run_dir.TRAIN_FEATURES_SAMPLE,
    "metrics": run_dir.METRICS,
}


@dataclass(frozen=True)
class ExportRequest:
    """Everything one export needs; built by the CLI from its options, or by a pipeline. Checks its numbers."""

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

    def __post_init__(self) -> None:
        if self.parity_rows < MIN_ROWS:
            raise InputError(f"--parity-rows must be >= {MIN_ROWS}, got {self.parity_rows}")
        if not self.parity_tol >= 0:
            raise InputError(f"--parity-tol must be >= 0, got {self.parity_tol}")
        if self.keep is not None and self.keep < 1:
            raise InputError(f"--keep must be >= 1, got {self.keep}")
        if not 0 <= self.max_calibration_gap < 1:
            raise InputError(f"--max-calibration-gap must be in [0, 1), got {self.max_calibration_gap}")
        if not (self.max_auc_drop >= 0 and self.max_ece_rise >= 0):
            raise InputError(
                f"--max-auc-drop and --max-ece-rise must be >= 0, got {self.max_auc_drop}, {self.max_ece_rise}"
            )

    @classmethod
    def from_run(cls, run: Path, /, **fields: Any) -> ExportRequest:
        """The export of training run `run` that `python -m export --run RUN` asks for: its best checkpoint,
        feature spec, and those of RUN_FILES it holds; `fields` set the other fields, or override these."""
        found = {name: run / rel for name, rel in RUN_FILES.items() if (run / rel).is_file()}
        base = {"checkpoint": run / run_dir.BEST_CHECKPOINT, "feature_spec": run / run_dir.FEATURE_SPEC}
        return cls(**{**base, "run": run, **found, **fields})


def request_defaults() -> dict[str, Any]:
    """The default of every ExportRequest field that has one, by field name (the CLI's defaults)."""
    return {f.name: f.default for f in fields(ExportRequest) if f.default is not MISSING}
