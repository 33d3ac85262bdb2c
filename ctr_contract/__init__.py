"""The contract between the stages: every name, path and rule that training, export and serving must agree on.

Standard library only (no numpy, no torch, no TensorFlow), so every stage and every client can import it:
the serving image ships it beside `serving/`. The stages meet only through files on disk; this package names
those files. docs/design.md describes the same contract in prose.

- `ctr_contract.schema`: the Criteo record (field names and types).
- `ctr_contract.run_dir`: what `python -m training --out RUN` writes and `python -m export --run RUN` reads.
- `ctr_contract.repository`: the versioned model repository that export writes and serving polls.
- `ctr_contract.manifest`: the format of a version's manifest, and the sha256 of its files.
- `ctr_contract.signatures`: signature keys and tensor names of every served version.
- `ctr_contract.tf_log`: every entrypoint's rule for TensorFlow's C++ log (quiet unless asked).
- `ctr_contract.ratelog`: the rate-limited log (serving's client and fault lines, the click join's dropped lines).
- `ctr_contract.traffic`: the `# ctr-traffic:` line of a model config file and the split by request id (the
  server routes by them, the rollout controller writes them).
- `disable_telemetry` (here): keep libraries from phoning home.
"""

import os

from ctr_contract.manifest import FILES_KEY, MANIFEST_KEYS, file_hashes, sha256_file
from ctr_contract.repository import (
    ASSETS_EXTRA,
    DRIFT_REFERENCE_PATH,
    FEATURE_SPEC_PATH,
    MANIFEST_PATH,
    MAX_VERSION,
    ONNX_MODEL,
    RAW_ONNX_MODEL,
    SAVED_MODEL,
    SAVED_MODEL_VARIABLES,
    STAGING_PREFIX,
    TORCHSCRIPT_MODEL,
    TRITON_CONFIG,
    WARMUP_PATH,
    parse_version_dir,
    version_dirs,
)
from ctr_contract.run_dir import (
    BEST_CHECKPOINT,
    CHECKPOINTS_DIR,
    FEATURE_SPEC,
    LAST_CHECKPOINT,
    LOGS_DIR,
    METRICS,
    TRAIN_FEATURES_SAMPLE,
    VAL_FEATURES,
    VAL_LABELS,
    VAL_RAW,
)
from ctr_contract.schema import CATEGORICAL_FIELDS, FIELDS, LABEL, N_FIELDS, NUMERIC_FIELDS, RAW_FIELDS
from ctr_contract.signatures import (
    DEFAULT_SIGNATURE,
    DEFAULT_WIDTH,
    INPUT_NAME,
    OUTPUT_NAME,
    RAW_SIGNATURE,
)

# onnxruntime (>= 1.29 on Linux) sends usage events to mobile.events.data.microsoft.com (a DNS lookup some seconds
# after the first session) and writes a device id under $HOME/.cache/Microsoft. A server on a read-only root
# filesystem in a cluster must do neither. `ORT_DISABLE_TELEMETRY=1` is ORT's full opt-out (no uploader, no events,
# no device-id file), read once when its environment starts, so `serving` and `export` set it when their package
# is imported, before any module imports onnxruntime.
OFFLINE_ENV = {"ORT_DISABLE_TELEMETRY": "1"}


def disable_telemetry() -> None:
    """Set every library's telemetry opt-out in this process's environment (and its children's)."""
    os.environ.update(OFFLINE_ENV)


__all__ = [
    "ASSETS_EXTRA",
    "BEST_CHECKPOINT",
    "CATEGORICAL_FIELDS",
    "CHECKPOINTS_DIR",
    "DEFAULT_SIGNATURE",
    "DEFAULT_WIDTH",
    "DRIFT_REFERENCE_PATH",
    "FEATURE_SPEC",
    "FEATURE_SPEC_PATH",
    "FIELDS",
    "FILES_KEY",
    "INPUT_NAME",
    "LABEL",
    "LAST_CHECKPOINT",
    "LOGS_DIR",
    "MANIFEST_KEYS",
    "MANIFEST_PATH",
    "MAX_VERSION",
    "METRICS",
    "NUMERIC_FIELDS",
    "N_FIELDS",
    "OFFLINE_ENV",
    "ONNX_MODEL",
    "OUTPUT_NAME",
    "RAW_FIELDS",
    "RAW_ONNX_MODEL",
    "RAW_SIGNATURE",
    "SAVED_MODEL",
    "SAVED_MODEL_VARIABLES",
    "STAGING_PREFIX",
    "TORCHSCRIPT_MODEL",
    "TRAIN_FEATURES_SAMPLE",
    "TRITON_CONFIG",
    "VAL_FEATURES",
    "VAL_LABELS",
    "VAL_RAW",
    "WARMUP_PATH",
    "disable_telemetry",
    "file_hashes",
    "parse_version_dir",
    "sha256_file",
    "version_dirs",
]
