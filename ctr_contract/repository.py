"""The versioned model repository: `<base>/<version>/...`, written by export and polled by serving.

TF Serving's layout, so the stock server serves it unchanged:

    <base>/config.pbtxt                          Triton's model config
    <base>/<version>/saved_model.pb variables/   the SavedModel (TF Serving, `--backend tf`)
    <base>/<version>/model.onnx model.pt         ONNX (our server's default), TorchScript
    <base>/<version>/model_raw.onnx              ONNX of the `raw` signature: the FeatureSpec, then the model
    <base>/<version>/assets.extra/manifest.json  what the version is, where it came from, file hashes
    <base>/<version>/assets.extra/feature_spec.json
    <base>/<version>/assets.extra/tf_serving_warmup_requests
    <base>/<version>/assets.extra/drift_reference.json
    <base>/<version>/assets.extra/feature_ranges.json
    <base>/<version>/assets.extra/calibration.json   the calibrator inside the graphs, and how it was fitted
    <base>/.tmp-*                                staging: never a version

A version folder appears by one atomic rename of a complete staging folder.
"""

from __future__ import annotations

import os
from pathlib import Path

# `<base>/.tmp-<version>-<host>-<token>-<pid>` (and its .lock) while an export writes; not a version name
STAGING_PREFIX = ".tmp-"
TRITON_CONFIG = "config.pbtxt"
SAVED_MODEL = "saved_model.pb"
SAVED_MODEL_VARIABLES = "variables"
ONNX_MODEL = "model.onnx"
RAW_ONNX_MODEL = "model_raw.onnx"  # the FeatureSpec + model: Criteo fields -> ctr, raw_score (`raw`)
TORCHSCRIPT_MODEL = "model.pt"
ASSETS_EXTRA = "assets.extra"
MANIFEST_PATH = f"{ASSETS_EXTRA}/manifest.json"
FEATURE_SPEC_PATH = f"{ASSETS_EXTRA}/feature_spec.json"
WARMUP_PATH = f"{ASSETS_EXTRA}/tf_serving_warmup_requests"  # TFRecord of PredictionLog, replayed on load
# The training-time bins of every input and of the scores: the reference of serving's drift PSI.
DRIFT_REFERENCE_PATH = f"{ASSETS_EXTRA}/drift_reference.json"
# The (min, max) of every model-input feature seen in training: serving names an absurd input with it.
FEATURE_RANGES_PATH = f"{ASSETS_EXTRA}/feature_ranges.json"
# The calibrator every graph of the version applies after the network (ctr_model.calibration.Calibrator's dict)
# and its fit report: the method, the negative sample rate, and the figures before and after on held-out rows.
CALIBRATION_PATH = f"{ASSETS_EXTRA}/calibration.json"

MAX_VERSION = 2**63 - 1  # versions travel as int64 in TF Serving's protos


def parse_version_dir(name: str) -> int | None:
    """The version number a folder name stands for, or None when the name is not a version.

    A version name is canonical: positive decimal ASCII digits with no leading zero, at most int64's maximum.
    So `1` and `42` are versions, while `0`, `01`, `+1`, ` 1`, `²` (a Unicode digit) and `.tmp-3` are not.

    Args:
        name: a folder name inside the model base path (not a path).

    Returns:
        the version number, or None.
    """
    if not (name.isascii() and name.isdigit()) or name[0] == "0" or len(name) > len(str(MAX_VERSION)):
        return None
    version = int(name)
    return version if version <= MAX_VERSION else None


def version_dirs(base: Path) -> dict[int, Path]:
    """The version folders under a model base path, by version number; {} when the base path is missing.

    Entries whose name is not a version, and entries that are not directories, are skipped. Other OS errors
    (the base path unreadable, or a file) propagate: the caller decides whether that is fatal.
    """
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return {}
    found: dict[int, Path] = {}
    for entry in entries:
        version = parse_version_dir(entry.name)
        if version is not None and entry.is_dir():
            found[version] = Path(entry.path)
    return found
