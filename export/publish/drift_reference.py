"""`assets.extra/drift_reference.json`: what the inputs and scores looked like when the model was trained.

For each model-input feature, the bin edges of its training distribution (deciles; one bin per value for
columns with few distinct values, such as indicators) and the share of training rows in each bin; the same for the
model's scores on the validation rows. The server (serving/observability/drift.py) bins its recent traffic with these
edges and exports the population stability index against these shares:

    PSI = sum over bins of (live - reference) * ln(live / reference), shares floored at PSI_FLOOR.

Rule of thumb: < 0.1 stable, 0.1-0.2 moderate shift, > 0.2 a shift worth acting on.
Under "raw", the same for each raw Criteo field (from the run's raw validation rows, `val_raw.npz`), for
requests that send raw fields: see `raw_bins`.
Feature names follow the FeatureSpec layout: I1..I13 (z-scores), I1_missing..I13_missing, C1_rate..C26_rate
(click-rate lifts), hash_0..hash_{width-HASH_START-1} (hashing-trick buckets; ctr_features/layout.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.layout import HASH_START
from export.errors import InputError

log = logging.getLogger(__name__)
REFERENCE_VERSION = 1
MAX_BINS = 10
RAW_TOP_VALUES = 20  # bins of a raw categorical field: its most frequent values, other, missing
MISSING_EDGE = -1e300  # a raw count's missing value (-inf after the transform) falls below this edge


def feature_names(width: int) -> list[str]:
    """Names of the `width` model-input columns, in column order."""
    names = [
        *NUMERIC_FIELDS,
        *(f"{f}_missing" for f in NUMERIC_FIELDS),
        *(f"{f}_rate" for f in CATEGORICAL_FIELDS),
    ]
    return names + [f"hash_{i}" for i in range(width - HASH_START)]


def bins_of(values: np.ndarray, max_bins: int = MAX_BINS) -> dict[str, list[float]]:
    """Edges (ascending) and the share of `values` per bin; bin i holds edges[i-1] <= x < edges[i].

    A column with at most `max_bins` distinct values (indicators, bucket counts, small counts) gets one bin
    per value, cut half-way between values, plus an empty bin on each side for values never seen in
    training. Any other column gets its deciles (merged where they repeat).
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    distinct = np.unique(v)
    if len(distinct) <= max_bins:
        half = float(np.diff(distinct).min()) / 2 if len(distinct) > 1 else 0.5
        mids = (distinct[:-1] + distinct[1:]) / 2
        edges = np.concatenate([[distinct[0] - half], mids, [distinct[-1] + half]])
    else:
        edges = np.unique(np.quantile(v, np.linspace(0.0, 1.0, max_bins + 1)[1:-1]))
    counts = np.bincount(np.searchsorted(edges, v, side="right"), minlength=len(edges) + 1)
    return {"edges": edges.tolist(), "fractions": (counts / max(1, len(v))).tolist()}


def raw_bins(numeric: np.ndarray, categorical: np.ndarray, top: int = RAW_TOP_VALUES) -> list[dict[str, Any]]:
    """Reference bins of the raw Criteo fields, one entry per field (labels stay field names: 39 series).

    A count is binned after sign(x) * log1p(|x|), with missing (NaN) below the first edge (MISSING_EDGE);
    a categorical field's bins are its `top` most frequent values, then "any other value", then missing ("").
    """
    out = []
    for j, name in enumerate(NUMERIC_FIELDS):
        v = np.asarray(numeric[:, j], dtype=np.float64)
        x = np.where(np.isnan(v), -np.inf, np.sign(v) * np.log1p(np.abs(v)))
        x = x.astype(np.float32).astype(np.float64)  # the server keeps float32: values on an edge stay on it
        present = bins_of(x[np.isfinite(x)]) if np.isfinite(x).any() else {"edges": [0.0]}
        edges = np.asarray([MISSING_EDGE, *present["edges"]])
        counts = np.bincount(np.searchsorted(edges, x, side="right"), minlength=len(edges) + 1)
        out.append({"name": name, "edges": edges.tolist(), "fractions": (counts / max(1, len(x))).tolist()})
    for j, name in enumerate(CATEGORICAL_FIELDS):
        col = np.asarray(categorical[:, j]).astype(str)
        values, counts = np.unique(col[col != ""], return_counts=True)
        kept = values[np.argsort(-counts, kind="stable")[:top]].tolist()
        known = np.isin(col, kept)
        fractions = [float(np.mean(col == value)) for value in kept]
        fractions += [float(np.mean(~known & (col != ""))), float(np.mean(col == ""))]
        out.append({"name": name, "values": kept, "fractions": fractions})
    return out


def build_reference(
    train_features: np.ndarray, val_scores: np.ndarray, sources: dict[str, str]
) -> dict[str, Any]:
    """The reference document.

    Args:
        train_features: float32 (N, width) training rows as the model sees them.
        val_scores: the model's click probabilities on the validation rows, (M,) or (M, 1).
        sources: where each part came from, for the reader ({"features": ..., "scores": ...}).
    """
    names = feature_names(train_features.shape[1])
    features = [{"name": n, **bins_of(train_features[:, j])} for j, n in enumerate(names)]
    return {
        "version": REFERENCE_VERSION,
        "sources": sources,
        "rows": {"features": len(train_features), "scores": int(np.size(val_scores))},
        "features": features,
        "score": bins_of(val_scores),
    }


def write_reference(
    path: Path,
    train_features: Path | None,
    val: np.ndarray | None,
    predict: Callable[[np.ndarray], np.ndarray],
    raw: tuple[np.ndarray, np.ndarray] | None = None,
) -> bool:
    """Write the reference of an export: features from the run's training sample (else its validation rows),
    scores of `predict` on the validation rows, and the raw fields of `raw` (numeric [N, 13], categorical
    [N, 26]: the run's raw validation rows) when given. Returns False (writes nothing) without validation rows.
    """
    if val is None:
        log.warning("no validation rows: %s not written, so the server exports no drift metrics", path.name)
        return False
    sources = {"scores": f"validation rows ({len(val)})"}
    features = val
    if train_features is not None and train_features.is_file():
        features = np.load(train_features, allow_pickle=False).astype(np.float32)
        sources["features"] = f"{train_features.name} ({len(features)} training rows)"
    else:
        sources["features"] = f"validation rows ({len(val)}); the run has no training sample"
    if features.ndim != 2 or features.shape[1] != val.shape[1]:
        raise InputError(f"{train_features} has shape {list(features.shape)}; expected [N, {val.shape[1]}]")
    doc = build_reference(features, predict(val), sources)
    if raw is not None and len(raw[0]):
        doc["raw"] = raw_bins(*raw)
        doc["sources"]["raw"] = f"raw validation rows ({len(raw[0])})"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return True
