"""FeatureSpec: raw Criteo fields -> float32 [N, width] vectors. Pure numpy, so export and serving can use it.

Layout of one vector (width 128 by default; C = 26 categorical fields):
  [0, 13)         numeric z-scores: z = clip((sign(x)*log1p(|x|) - mean) / std, ±clip); 0 when missing
  [13, 26)        missing indicators for I1..I13 (1.0 = missing or non-finite)
  [26, 52)        click-rate lift of each categorical value (see `training.rates`); 0 for rare/unseen
  [52, width)     hashing trick: bucket = key % (width - 52), each field adds 1.0
where key = fnv1a_32(utf8(field + ":" + value)), and a missing categorical is the empty value "".
The spec is data: `feature_spec.json` holds every number needed to reproduce the vectors bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.hashing import StringColumn, encode_strings, fnv1a_column
from training.rates import RateTable, fit_rate_table
from training.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS

SPEC_VERSION = 1
N_NUM = len(NUMERIC_FIELDS)
N_CAT = len(CATEGORICAL_FIELDS)
HASH_START = 2 * N_NUM + N_CAT  # 52: z-scores, indicators, rate lifts come first
DEFAULT_WIDTH = 128


def signed_log1p(x: np.ndarray) -> np.ndarray:
    """sign(x) * log1p(|x|): tames heavy-tailed counts and keeps Criteo's -1 values."""
    return np.sign(x) * np.log1p(np.abs(x))


def categorical_keys(categorical: np.ndarray | Sequence[StringColumn], n: int) -> np.ndarray:
    """Stable per-field value hashes, uint32 [N, 26].

    Args:
        categorical: [N, 26] array of str/None, or 26 packed `StringColumn`s (one per field).
    """
    if isinstance(categorical, np.ndarray):
        if categorical.ndim != 2 or categorical.shape != (n, N_CAT):
            raise ValueError(
                f"expected categorical fields of shape [{n}, {N_CAT}], got {list(categorical.shape)}"
            )
        columns = [encode_strings(categorical[:, j].tolist()) for j in range(N_CAT)]
    else:
        columns = list(categorical)
        if len(columns) != N_CAT:
            raise ValueError(f"expected {N_CAT} categorical columns, got {len(columns)}")
    keys = np.empty((n, N_CAT), dtype=np.uint32)
    for j, (field, column) in enumerate(zip(CATEGORICAL_FIELDS, columns, strict=True)):
        if len(column[1]) != n + 1:
            raise ValueError(f"categorical column {field} has {len(column[1]) - 1} values, expected {n}")
        keys[:, j] = fnv1a_column(column, prefix=f"{field}:")
    return keys


@dataclass(frozen=True)
class FeatureSpec:
    """Fitted transform parameters; build with `FeatureSpec.fit`, persist with `save`/`load`."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    rates: tuple[RateTable, ...]
    prior: float
    width: int = DEFAULT_WIDTH
    clip: float = 10.0
    min_count: int = 1000
    smoothing: float = 100.0

    def __post_init__(self) -> None:
        if self.width <= HASH_START:
            raise ValueError(
                f"width must exceed {HASH_START} (13 z-scores, 13 indicators, 26 rate lifts), got {self.width}"
            )
        if len(self.mean) != N_NUM or len(self.std) != N_NUM or len(self.rates) != N_CAT:
            raise ValueError(
                f"expected {N_NUM} means/stds and {N_CAT} rate tables, got {len(self.mean)}/{len(self.std)}/{len(self.rates)}"
            )
        if not all(np.isfinite(self.mean)) or not all(s > 0 and np.isfinite(s) for s in self.std):
            raise ValueError(
                f"means must be finite and stds finite and positive, got {self.mean}, {self.std}"
            )
        if not 0.0 < self.prior < 1.0:
            raise ValueError(f"prior click rate must be in (0, 1), got {self.prior}")

    @property
    def buckets(self) -> int:
        return self.width - HASH_START

    @classmethod
    def fit(
        cls,
        numeric: np.ndarray,
        categorical: np.ndarray | Sequence[StringColumn],
        labels: np.ndarray,
        width: int = DEFAULT_WIDTH,
        min_count: int = 1000,
        smoothing: float = 100.0,
        max_entries: int = 10_000,
    ) -> FeatureSpec:
        """Fit on the training split only.

        Args:
            numeric: float [N, 13], NaN where a cell is missing.
            categorical: [N, 26] strings or 26 `StringColumn`s.
            labels: 0/1 [N].
            width: output width; columns beyond 52 are hashing-trick buckets.
            min_count / smoothing / max_entries: rate table settings (see `training.rates`).
        """
        v = signed_log1p(_check_numeric(numeric).astype(np.float64))
        present = np.isfinite(v)
        count = present.sum(axis=0)
        mean = np.divide(np.where(present, v, 0.0).sum(axis=0), count, out=np.zeros(N_NUM), where=count > 0)
        sq = np.where(present, (v - mean) ** 2, 0.0).sum(axis=0)
        std = np.sqrt(np.divide(sq, count, out=np.ones(N_NUM), where=count > 0))
        std = np.where(std > 1e-6, std, 1.0)  # constant or absent column: centre only
        y = np.asarray(labels, dtype=np.float64).reshape(-1)
        keys = categorical_keys(categorical, y.size)
        prior = float(np.clip(y.mean(), 1e-4, 1 - 1e-4)) if y.size else 0.5
        rates = tuple(
            fit_rate_table(keys[:, j], y, prior, min_count, smoothing, max_entries) for j in range(N_CAT)
        )
        return cls(
            tuple(map(float, mean)), tuple(map(float, std)), rates, prior, width, 10.0, min_count, smoothing
        )

    def transform(self, numeric: np.ndarray, categorical: np.ndarray | Sequence[StringColumn]) -> np.ndarray:
        """Map raw rows to model input.

        Args:
            numeric: float [N, 13], NaN (or any non-finite) where missing.
            categorical: [N, 26] array of str/None, or 26 packed `StringColumn`s (one per field).
        Returns:
            float32 [N, width], always finite.
        """
        num = _check_numeric(numeric).astype(np.float64)
        n = num.shape[0]
        keys = categorical_keys(categorical, n)
        out = np.zeros((n, self.width), dtype=np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            v = signed_log1p(num)
        missing = ~np.isfinite(v)
        z = (np.where(missing, 0.0, v) - np.asarray(self.mean)) / np.asarray(self.std)
        out[:, :N_NUM] = np.clip(np.where(missing, 0.0, z), -self.clip, self.clip)
        out[:, N_NUM : 2 * N_NUM] = missing
        rows = np.arange(n)
        for j, table in enumerate(self.rates):
            out[:, 2 * N_NUM + j] = table.lookup(keys[:, j])
            out[rows, HASH_START + (keys[:, j] % np.uint32(self.buckets)).astype(np.int64)] += 1.0
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION,
            "width": self.width,
            "layout": __doc__.split("Layout of one vector", 1)[1].split("The spec is data")[0].strip(),
            "numeric": {
                "fields": list(NUMERIC_FIELDS),
                "mean": list(self.mean),
                "std": list(self.std),
                "clip": self.clip,
            },
            "categorical": {
                "fields": list(CATEGORICAL_FIELDS),
                "key": "fnv1a_32(utf8(field + ':' + value)), missing value = ''",
                "buckets": self.buckets,
                "prior": self.prior,
                "min_count": self.min_count,
                "smoothing": self.smoothing,
                "rates": {f: t.to_dict() for f, t in zip(CATEGORICAL_FIELDS, self.rates, strict=True)},
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
            rates = tuple(RateTable.from_dict(cat["rates"][f]) for f in CATEGORICAL_FIELDS)
            return cls(
                tuple(num["mean"]), tuple(num["std"]), rates, float(cat["prior"]), int(d["width"]),
                float(num["clip"]), int(cat["min_count"]), float(cat["smoothing"]),
            )  # fmt: skip
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


def _check_numeric(numeric: np.ndarray) -> np.ndarray:
    arr = np.asarray(numeric)
    if arr.ndim != 2 or arr.shape[1] != N_NUM:
        raise ValueError(f"expected numeric fields of shape [N, {N_NUM}], got {list(arr.shape)}")
    return arr
