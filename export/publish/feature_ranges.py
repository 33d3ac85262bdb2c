"""`assets.extra/feature_ranges.json`: the (min, max) of every model-input feature seen in training.

The server (serving/runtime/input_range.py) reads it with the version. When a model's output is not finite,
it looks at the request's features: one far outside its training range makes the answer a 400 naming the
instance, the feature, its value and the range (a client's absurd input), instead of the 500 of a model that
fails on an input it should handle. The ranges come from the rows export already has: the run's training sample
(`train_features_sample.npy`) and its validation rows (`val_features.npy`), together.

    {"version": 1, "source": "...", "rows": N, "features": [{"name": "I1", "min": -1.2, "max": 4.5}, ...]}

Names follow the FeatureSpec layout (export/publish/drift_reference.py: `feature_names`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from export.errors import InputError
from export.publish.drift_reference import feature_names

log = logging.getLogger(__name__)
RANGES_VERSION = 1


def build_ranges(rows: np.ndarray, source: str) -> dict[str, Any]:
    """The document for (N, width) finite rows: per column its name, min and max (as float32 values)."""
    lo, hi = rows.min(axis=0), rows.max(axis=0)
    names = feature_names(rows.shape[1])[: rows.shape[1]]  # a test's narrow rows get the first names
    features = [{"name": n, "min": float(a), "max": float(b)} for n, a, b in zip(names, lo, hi, strict=True)]
    return {"version": RANGES_VERSION, "source": source, "rows": len(rows), "features": features}


def write_ranges(path: Path, train_features: Path | None, val: np.ndarray | None) -> bool:
    """Write the ranges of the run's training sample and validation rows; False (nothing written) without any.

    A version without the file is served with the range check off (the server logs it once).
    """
    parts, sources = [], []
    if val is not None and len(val):
        parts.append(val)
        sources.append(f"validation rows ({len(val)})")
    if train_features is not None and train_features.is_file():
        try:
            train = np.load(train_features, allow_pickle=False).astype(np.float32)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read training rows {train_features}: {e}") from e
        width = val.shape[1] if val is not None else train.shape[1] if train.ndim == 2 else -1
        if train.ndim != 2 or train.shape[1] != width or not np.isfinite(train).all():
            raise InputError(
                f"{train_features} has shape {list(train.shape)}; expected finite float32 [N, {width}]"
            )
        if len(train):
            parts.append(train)
            sources.append(f"{train_features.name} ({len(train)} training rows)")
    if not parts:
        log.warning(
            "no training or validation rows: %s not written, so the server has no range check", path.name
        )
        return False
    doc = build_ranges(np.concatenate(parts), " + ".join(sources))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return True
