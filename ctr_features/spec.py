"""FeatureSpec: raw Criteo fields -> float32 [N, width] vectors. Pure numpy: it needs no torch to run.

The vector's layout is in `ctr_features.layout`; the fit and its defaults are in `ctr_features.fit`.
The spec is data: `feature_spec.json` holds every number needed to reproduce the vectors bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_contract.signatures import DEFAULT_WIDTH
from ctr_features.fit import (
    CLIP,
    MIN_COUNT,
    SMOOTHING,
    VOCAB_MIN_COUNT,
    VOCAB_SIZE,
    FitChunk,
    fit_parameters,
)
from ctr_features.hashing import StringColumn
from ctr_features.layout import (
    HASH_START,
    LAYOUT,
    LIFT_START,
    N_CAT,
    N_NUM,
    categorical_values,
    check_numeric,
    signed_log1p,
)
from ctr_features.vocabulary import FieldTable

SPEC_VERSION = 2  # 2: vocabularies + out-of-vocabulary column instead of hashing every value


@dataclass(frozen=True)
class FeatureSpec:
    """Fitted transform parameters; build with `FeatureSpec.fit`, persist with `save`/`load`."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    tables: tuple[FieldTable, ...]
    prior: float
    width: int = DEFAULT_WIDTH
    clip: float = CLIP
    min_count: int = MIN_COUNT
    smoothing: float = SMOOTHING
    vocab_size: int = VOCAB_SIZE
    vocab_min_count: int = VOCAB_MIN_COUNT

    def __post_init__(self) -> None:
        if self.width <= HASH_START + 1:
            raise ValueError(
                f"width must exceed {HASH_START + 1} ({N_NUM} z-scores, {N_NUM} indicators, {N_CAT} rate lifts, "
                f"an out-of-vocabulary column), got {self.width}"
            )
        if len(self.mean) != N_NUM or len(self.std) != N_NUM or len(self.tables) != N_CAT:
            raise ValueError(
                f"expected {N_NUM} means/stds and {N_CAT} field tables, got {len(self.mean)}/{len(self.std)}/{len(self.tables)}"
            )
        if not all(np.isfinite(self.mean)) or not all(s > 0 and np.isfinite(s) for s in self.std):
            raise ValueError(
                f"means must be finite and stds finite and positive, got {self.mean}, {self.std}"
            )
        if not 0.0 < self.prior < 1.0:
            raise ValueError(f"prior click rate must be in (0, 1), got {self.prior}")

    @property
    def buckets(self) -> int:
        """Hashed buckets for vocabulary values (the last column counts out-of-vocabulary values)."""
        return self.width - HASH_START - 1

    @property
    def oov_column(self) -> int:
        return self.width - 1

    @classmethod
    def fit(
        cls,
        numeric: np.ndarray,
        categorical: np.ndarray | Sequence[StringColumn],
        labels: np.ndarray,
        width: int = DEFAULT_WIDTH,
        **settings: Any,
    ) -> FeatureSpec:
        """Fit on the training split only.

        Args:
            numeric: float [N, 13], NaN where a cell is missing.
            categorical: [N, 26] strings or 26 `StringColumn`s.
            labels: 0/1 [N].
            width: output width; columns from HASH_START on are vocabulary buckets and the out-of-vocabulary count.
            settings: min_count, smoothing, max_entries (rate tables), vocab_size, vocab_min_count (vocabularies);
                their defaults and meaning are in `ctr_features.fit.fit_parameters`.
        """
        num = check_numeric(numeric)

        def one_chunk(numeric_only: bool) -> Iterator[tuple[np.ndarray, Any, np.ndarray]]:
            yield num, None if numeric_only else categorical, labels

        # One home for the statistics: the in-memory fit is the streaming fit over a single chunk.
        return cls.fit_streaming(one_chunk, width, **settings)

    @classmethod
    def fit_streaming(
        cls, chunks: Callable[[bool], Iterable[FitChunk]], width: int = DEFAULT_WIDTH, **settings: Any
    ) -> FeatureSpec:
        """Fit on training rows that arrive in chunks (see `ctr_features.fit`); equal to `fit` on them all.

        Args:
            chunks: called twice, with numeric_only False then True; each call yields the same rows in order.
            width / settings: as in `fit`.
        """
        return cls(**fit_parameters(chunks, width, **settings))

    def transform(self, numeric: np.ndarray, categorical: np.ndarray | Sequence[StringColumn]) -> np.ndarray:
        """Map raw rows to model input.

        Args:
            numeric: float [N, 13], NaN (or any non-finite) where missing.
            categorical: [N, 26] array of str/None, or 26 packed `StringColumn`s (one per field).
        Returns:
            float32 [N, width], always finite.
        """
        num = check_numeric(numeric).astype(np.float64)
        n = num.shape[0]
        columns = categorical_values(categorical, n)
        out = np.zeros((n, self.width), dtype=np.float32)
        out[:, :N_NUM], out[:, N_NUM:LIFT_START] = self.numeric_columns(num)
        rows = np.arange(n)
        for j, (table, col) in enumerate(zip(self.tables, columns, strict=True)):
            bucket, lift = table.lookup(col)
            out[:, LIFT_START + j] = lift
            out[rows, np.where(bucket >= 0, HASH_START + bucket, self.oov_column)] += 1.0
        return out

    def numeric_columns(self, num: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Clipped z-scores float64 [N, 13] (0 where missing) and missing flags bool [N, 13] of float64 counts."""
        with np.errstate(invalid="ignore", over="ignore"):
            v = signed_log1p(num)
        missing = ~np.isfinite(v)
        z = (np.where(missing, 0.0, v) - np.asarray(self.mean)) / np.asarray(self.std)
        return np.clip(np.where(missing, 0.0, z), -self.clip, self.clip), missing

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION,
            "width": self.width,
            "layout": LAYOUT,
            "numeric": {
                "fields": list(NUMERIC_FIELDS),
                "mean": list(self.mean),
                "std": list(self.std),
                "clip": self.clip,
            },
            "categorical": {
                "fields": list(CATEGORICAL_FIELDS),
                "bucket": "fnv1a_32(utf8(field + ':' + value)) % buckets for vocabulary values, missing value = ''",
                "buckets": self.buckets,
                "oov_column": self.oov_column,
                "prior": self.prior,
                "min_count": self.min_count,
                "smoothing": self.smoothing,
                "vocab_size": self.vocab_size,
                "vocab_min_count": self.vocab_min_count,
                "tables": {t.field: t.to_dict() for t in self.tables},
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureSpec:
        if d.get("version") != SPEC_VERSION:
            raise ValueError(
                f"feature spec version {d.get('version')!r} is not supported (expected {SPEC_VERSION})"
            )
        try:
            num, cat = d["numeric"], d["categorical"]
            if list(num["fields"]) != list(NUMERIC_FIELDS) or list(cat["fields"]) != list(CATEGORICAL_FIELDS):
                raise ValueError("fields differ from the Criteo layout I1..I13, C1..C26")
            width = int(d["width"])
            n_buckets = width - HASH_START - 1
            tables = tuple(FieldTable.from_dict(f, cat["tables"][f], n_buckets) for f in CATEGORICAL_FIELDS)
            return cls(
                tuple(num["mean"]),
                tuple(num["std"]),
                tables,
                float(cat["prior"]),
                width,
                float(num["clip"]),
                int(cat["min_count"]),
                float(cat["smoothing"]),
                int(cat["vocab_size"]),
                int(cat["vocab_min_count"]),
            )
        except KeyError as e:
            raise ValueError(f"feature spec is missing key {e}") from e

    def save(self, path: str | Path) -> None:
        """Write compact JSON (rate tables can hold tens of thousands of entries)."""
        Path(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> FeatureSpec:
        p = Path(path)
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError, ValueError) as e:
            raise ValueError(f"cannot read feature spec {p}: {e}") from e
