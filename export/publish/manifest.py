"""`assets.extra/manifest.json`: what a version is, where it came from and how it was checked.

The format (its keys, the `files` map and its sha256) is `ctr_contract.manifest`, which serving checks against.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ctr_contract.manifest import FILES_KEY, sha256_file
from export.errors import InputError

PACKAGES = ("torch", "onnx", "onnxscript", "onnxruntime", "tensorflow", "tensorflow-serving-api", "numpy")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that produced the artifacts."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def read_metrics(path: Path | None) -> dict[str, Any] | None:
    """Training metrics (metrics.json of the run dir), or None when absent.

    Raises:
        InputError: the file exists but is not a JSON object.
    """
    if path is None or not path.is_file():
        return None
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read training metrics {path}: {e}") from e
    if not isinstance(metrics, dict):
        raise InputError(f"training metrics {path} hold {type(metrics).__name__}; expected a JSON object")
    return metrics


def build_manifest(
    *,
    version: int,
    checkpoint: Path,
    ckpt: dict[str, Any],
    metrics: dict[str, Any] | None,
    io: dict[str, Any],
    opset: int,
    target: dict[str, Any],
    patches: list[dict[str, str]],
    parity: dict[str, Any],
    files: dict[str, str],
    export_seconds: float,
    quality_gate: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the manifest dict (JSON-serialisable)."""
    return {
        "version": version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source_checkpoint": {
            "path": str(checkpoint.resolve()),
            "sha256": sha256_file(checkpoint),
            "epoch": ckpt.get("epoch"),
            "global_step": ckpt.get("global_step"),
            "model": (ckpt.get("hyper_parameters") or {}).get("model"),
        },
        # the run's metrics.json without what export itself wrote into it (its `calibration` figures)
        "training_metrics": {k: v for k, v in metrics.items() if k != "calibration"} if metrics else metrics,
        "io": io,
        "opset": opset,
        "target": target,
        "op_patches": patches,
        "parity": parity,
        "quality_gate": quality_gate,  # export/gates/gate.py: both models' figures; "forced" when --force published it
        "calibration": calibration,  # export/calibration.py: the calibrator in every graph and its fit report
        FILES_KEY: files,
        "export_seconds": round(export_seconds, 3),
        "packages": package_versions(),
    }


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
