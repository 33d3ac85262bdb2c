"""The FeatureSpec compiled for serving: a RawBatch -> the float32 features the `serving_default` model takes.

`FeatureSpec.transform` stays the one definition (training/features/spec.py): this module takes its fitted
numbers and tables and applies them with the same numpy expressions, but looks categorical values up in one
Python dict per field (a C hash: ~50 ns a value) instead of sorted-array searches built for million-row
chunks. The result is then scored by the features model, which skips ONNX Runtime's per-input conversion of
the 39-input raw graph (docs/raw-features.md, "Where the time goes").

It serves only behind two gates: export compares it with `FeatureSpec.transform` + PyTorch on the raw parity
rows (export/raw_parity.py), and a load replays the warm-up records' raw rows and compares its scores with
the expected ones recorded at export (serving/versions/warmup.py).
"""

from __future__ import annotations

from itertools import chain, repeat
from pathlib import Path

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS
from serving.batches import RawBatch
from training.features.layout import HASH_START, N_NUM, signed_log1p
from training.features.spec import FeatureSpec

SMALL_BATCH = 8  # up to this many rows: the per-call overhead of numpy decides, not the per-value work


class RawTransform:
    """`FeatureSpec.transform` on field-major RawBatches, with per-field dict lookups."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.width = spec.width
        self._mean = np.asarray(spec.mean, np.float64)[:, None]  # (13, 1): field-major batches
        self._std = np.asarray(spec.std, np.float64)[:, None]
        self._clip = spec.clip
        # Entry 0 is "no entry": lift 0, the out-of-vocabulary column. Every other entry is one (field, value)
        # that a table of the field holds, with its lift (or 0) and its column (its bucket, or OOV).
        lifts, columns = [0.0], [spec.oov_column]
        self._lookups: list[dict[str, int]] = []
        for table in spec.tables:
            lift = dict(zip((v.decode("utf-8") for v in table.rate_values), table.lift.tolist(), strict=True))
            bucket = dict(zip((v.decode("utf-8") for v in table.vocab), table.bucket.tolist(), strict=True))
            lookup = {}
            for value in sorted(lift.keys() | bucket.keys()):
                lookup[value] = len(lifts)
                lifts.append(lift.get(value, 0.0))
                columns.append(HASH_START + bucket[value] if value in bucket else spec.oov_column)
            self._lookups.append(lookup)
        self._lift = np.asarray(lifts, np.float64)
        self._column = np.asarray(columns, np.intp)

    def probe(self) -> RawBatch:
        """Two rows for a load check when warm-up has none: all missing, and each field's first table value."""
        known = [min(lookup, default="") for lookup in self._lookups]
        numeric = np.array([[np.nan] * N_NUM, [3.0] * N_NUM]).T
        return RawBatch(numeric, np.array([[""] * len(known), known], dtype=object).T.copy())

    @classmethod
    def load(cls, path: Path) -> RawTransform:
        """From a version's `assets.extra/feature_spec.json`."""
        return cls(FeatureSpec.load(path))

    def entries(self, categorical: np.ndarray) -> np.ndarray:
        """(26, N) str values -> (26, N) entry indices (0 where the field's tables hold no such value)."""
        n = categorical.shape[1]
        # One C-level pass over every value: dict.get(field's dict, value, 0), field by field.
        tables = (
            self._lookups if n == 1 else chain.from_iterable(repeat(lookup, n) for lookup in self._lookups)
        )
        found = map(dict.get, tables, categorical.ravel().tolist(), repeat(0))
        return np.fromiter(found, np.intp, len(CATEGORICAL_FIELDS) * n).reshape(len(CATEGORICAL_FIELDS), n)

    def __call__(self, batch: RawBatch) -> np.ndarray:
        """The batch's float32 (N, width) features, equal to `FeatureSpec.transform` of its rows."""
        n = len(batch)
        out = np.zeros((n, self.width), np.float32)
        # No np.errstate (~1.5 µs): counts are within ±2**53 or NaN/±Inf, and none of these operations makes
        # a NaN or an overflow from them (log1p(inf) = inf, and NaN propagates without a warning).
        v = signed_log1p(batch.numeric)
        missing = ~np.isfinite(v)
        # The spec's expressions, elementwise, in float64: the same numbers in either layout. A missing
        # value's z is replaced by 0 before the clip, so it need not be zeroed before the z-score too.
        z = np.where(missing, 0.0, (v - self._mean) / self._std)
        out[:, :N_NUM] = np.minimum(np.maximum(z, -self._clip), self._clip).T  # np.clip, without its wrapper
        out[:, N_NUM : 2 * N_NUM] = missing.T
        entries = self.entries(batch.categorical)
        out[:, 2 * N_NUM : HASH_START] = self._lift[entries].T
        # Bucket counts: every (row, column) hit, counted at once (two fields may share a bucket; the counts are
        # small integers, exact in float32). np.add.at has the least overhead for a few rows, bincount for many.
        if n <= SMALL_BATCH:
            np.add.at(out, (np.arange(n), self._column[entries]), 1.0)
        else:
            flat = (self._column[entries] + np.arange(n) * self.width).ravel()
            out += np.bincount(flat, minlength=n * self.width).reshape(n, self.width)
        return out
