"""FeatureSpec: raw Criteo fields -> float32 [N, width] vectors. Pure numpy: it needs no torch to run.

Layout of one vector (width 128 by default; C = 26 categorical fields):
  [0, 13)         numeric z-scores: z = clip((sign(x)*log1p(|x|) - mean) / std, ±clip); 0 when missing
  [13, 26)        missing indicators for I1..I13 (1.0 = missing or non-finite)
  [26, 52)        click-rate lift of each categorical value (see `training.vocabulary`); 0 for rare/unseen
  [52, width-1)   hashed buckets: a value in its field's vocabulary adds 1.0 at
                  52 + fnv1a_32(utf8(field + ":" + value)) % (width - 53)
  width-1         out-of-vocabulary count: how many of the 26 values are not in their field's vocabulary
A missing categorical is the empty value "". Each field's vocabulary is its most frequent training values
(`vocab_size`, seen >= `vocab_min_count` times), so every table is a string -> number lookup that ONNX
(`LabelEncoder`) and TF (`StaticHashTable`) run with standard ops; see docs/raw-features.md.
The spec is data: `feature_spec.json` holds every number needed to reproduce the vectors bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from training.hashing import StringColumn, encode_strings
from training.vocabulary import FieldTable, value_array

SPEC_VERSION = 2  # 2: vocabularies + out-of-vocabulary column instead of hashing every value
N_NUM = len(NUMERIC_FIELDS)
N_CAT = len(CATEGORICAL_FIELDS)
HASH_START = 2 * N_NUM + N_CAT  # 52: z-scores, indicators, rate lifts come first
DEFAULT_WIDTH = 128
VOCAB_SIZE = 10_000  # per field; bounds feature_spec.json and the serving graphs' lookup tables
VOCAB_MIN_COUNT = 5


def signed_log1p(x: np.ndarray) -> np.ndarray:
    """sign(x) * log1p(|x|): tames heavy-tailed counts and keeps Criteo's -1 values."""
    return np.sign(x) * np.log1p(np.abs(x))


def categorical_values(categorical: np.ndarray | Sequence[StringColumn], n: int) -> list[np.ndarray]:
    """The 26 fields' values as sortable byte arrays (see `training.vocabulary.value_array`), missing = b''.

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
    for field, column in zip(CATEGORICAL_FIELDS, columns, strict=True):
        if len(column[1]) != n + 1:
            raise ValueError(f"categorical column {field} has {len(column[1]) - 1} values, expected {n}")
    return [value_array(column) for column in columns]


@dataclass(frozen=True)
class FeatureSpec:
    """Fitted transform parameters; build with `FeatureSpec.fit`, persist with `save`/`load`."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    tables: tuple[FieldTable, ...]
    prior: float
    width: int = DEFAULT_WIDTH
    clip: float = 10.0
    min_count: int = 1000
    smoothing: float = 100.0
    vocab_size: int = VOCAB_SIZE
    vocab_min_count: int = VOCAB_MIN_COUNT

    def __post_init__(self) -> None:
        if self.width <= HASH_START + 1:
            raise ValueError(
                f"width must exceed {HASH_START + 1} (13 z-scores, 13 indicators, 26 rate lifts, "
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
        min_count: int = 1000,
        smoothing: float = 100.0,
        max_entries: int = 10_000,
        vocab_size: int = VOCAB_SIZE,
        vocab_min_count: int = VOCAB_MIN_COUNT,
    ) -> FeatureSpec:
        """Fit on the training split only.

        Args:
            numeric: float [N, 13], NaN where a cell is missing.
            categorical: [N, 26] strings or 26 `StringColumn`s.
            labels: 0/1 [N].
            width: output width; columns from 52 on are vocabulary buckets and the out-of-vocabulary count.
            min_count / smoothing / max_entries: rate table settings (see `training.vocabulary`).
            vocab_size / vocab_min_count: per-field vocabulary bounds.
        """
        from training.spec_fit import fit_streaming  # builds on this module: imported here, not at the top

        num = _check_numeric(numeric)

        def one_chunk(numeric_only: bool) -> Iterator[tuple[np.ndarray, Any, np.ndarray]]:
            yield num, None if numeric_only else categorical, labels

        # One home for the statistics: the in-memory fit is the streaming fit over a single chunk.
        return fit_streaming(one_chunk, width, min_count, smoothing, max_entries, vocab_size, vocab_min_count)

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
        columns = categorical_values(categorical, n)
        out = np.zeros((n, self.width), dtype=np.float32)
        out[:, :N_NUM], out[:, N_NUM : 2 * N_NUM] = self.numeric_columns(num)
        rows = np.arange(n)
        for j, (table, col) in enumerate(zip(self.tables, columns, strict=True)):
            bucket, lift = table.lookup(col)
            out[:, 2 * N_NUM + j] = lift
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
            "layout": __doc__.split("Layout of one vector", 1)[1].split("The spec is data")[0].strip(),
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
                tuple(num["mean"]), tuple(num["std"]), tables, float(cat["prior"]), width,
                float(num["clip"]), int(cat["min_count"]), float(cat["smoothing"]),
                int(cat["vocab_size"]), int(cat["vocab_min_count"]),
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
