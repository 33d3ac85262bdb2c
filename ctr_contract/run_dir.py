"""The training run directory: written by `python -m training --out RUN`, read by `python -m export --run RUN`.

Every name is relative to RUN.
"""

from __future__ import annotations

CHECKPOINTS_DIR = "checkpoints"
BEST_CHECKPOINT = f"{CHECKPOINTS_DIR}/best.ckpt"  # best validation AUC; the pure network under `net.`
LAST_CHECKPOINT = f"{CHECKPOINTS_DIR}/last.ckpt"  # written at every epoch end; `--resume` continues from it
FEATURE_SPEC = "feature_spec.json"  # the FeatureSpec fitted on the training split
METRICS = "metrics.json"  # val_auc, val_logloss, oracle_*, samples_per_sec, global_step, epochs, ...
VAL_FEATURES = "val_features.npy"  # float32 [<=50000, width] validation rows (parity, calibrator fit)
VAL_RAW = "val_raw.npz"  # numeric float64 [<=50000, 13], categorical str [<=50000, 26]: VAL_FEATURES raw
VAL_LABELS = "val_labels.npy"  # float32 [<=50000] the labels of VAL_FEATURES (export's quality gate)
# float32 [<=10000, width] training rows: export's drift reference
TRAIN_FEATURES_SAMPLE = "train_features_sample.npy"
LOGS_DIR = "logs"  # Lightning's CSV logger
# Written by `python -m export --run RUN`: the calibrator's reliability diagram (before / after, on held-out rows)
RELIABILITY_PLOT = "reliability.png"
