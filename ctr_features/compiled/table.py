"""The FeatureSpec compiled for serving: a RawBatch -> the float32 features the `serving_default` model takes.

`FeatureSpec.transform` stays the one definition (ctr_features/spec.py): this module reads its fitted
numbers and tables from `feature_spec.json` (the version's own, as export wrote it) and applies them with the same
numpy expressions, but looks categorical values up in a hash table over the whole batch
(ctr_features/compiled/value_table.py; one Python dict per field for a few rows) instead of sorted-array searches
built for million-row chunks. The result is then scored by the features model, which skips ONNX Runtime's
per-input conversion of the 39-input raw graph (docs/raw-features.md).

It serves only behind two gates: export compares it with `FeatureSpec.transform` + PyTorch on the raw parity
rows (export/gates/raw_parity.py), and a load replays the warm-up records' raw rows and compares its scores with
the expected ones recorded at export (serving/repository/warmup.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.few_rows import DICT_ROWS, OneRowTransform
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.value_table import ValueTable
from ctr_features.hashing import fnv1a_32
from ctr_features.layout import HASH_START, LIFT_START, N_NUM
from ctr_features.spec import SPEC_VERSION


class RawTransform:
    """`FeatureSpec.transform` on field-major RawBatches, with per-field dict lookups."""

    def __init__(self, spec: dict[str, Any]) -> None:
        """From feature_spec.json's content (`FeatureSpec.to_dict()`), as a version holds it."""
        if spec.get("version") != SPEC_VERSION:
            raise ValueError(f"feature spec version {spec.get('version')!r} is not {SPEC_VERSION}")
        num, cat = spec["numeric"], spec["categorical"]
        if list(num["fields"]) != list(NUMERIC_FIELDS) or list(cat["fields"]) != list(CATEGORICAL_FIELDS):
            raise ValueError("fields differ from the Criteo layout I1..I13, C1..C26")
        self.width = int(spec["width"])
        self._mean = np.asarray(num["mean"], np.float64)[:, None]  # (13, 1): field-major batches
        self._std = np.asarray(num["std"], np.float64)[:, None]
        self._clip = float(num["clip"])
        buckets, oov = int(cat["buckets"]), int(cat["oov_column"])
        # Entry 0 is "no entry": lift 0, the out-of-vocabulary column. Every other entry is one (field, value)
        # that a table of the field holds, with its lift (or 0) and its column (its bucket, or OOV).
        # "" (missing) has an entry in every field, like any value the tables lack when they lack it (lift 0,
        # the OOV column): the output is the same, and the entries tell a missing value from an unseen one
        # (drift bins them apart: serving/observability/drift.py).
        lifts, columns = [0.0], [oov]
        self.lookups: list[dict[str, int]] = []
        for field in CATEGORICAL_FIELDS:
            table = cat["tables"][field]
            lift = dict(zip(table["rate_values"], map(float, table["rate_lift"]), strict=True))
            vocabulary = set(table["vocabulary"])
            lookup = {}
            for value in sorted(lift.keys() | vocabulary | {""}):
                lookup[value] = len(lifts)
                lifts.append(lift.get(value, 0.0))
                in_vocabulary = value in vocabulary
                columns.append(HASH_START + fnv1a_32(f"{field}:{value}") % buckets if in_vocabulary else oov)
            self.lookups.append(lookup)
        self.entry_count = len(lifts)
        self._table = ValueTable(self.lookups, 0)
        # float32 and int32: the output is float32 (the same numbers as a cast at assignment), and small
        # tables leave the cache to the features model that runs next.
        self._lift = np.asarray(lifts, np.float64).astype(np.float32)
        self._column = np.asarray(columns, np.int32)
        self._counts_after_lifts = bool(self._column.min() >= HASH_START)  # the layout's, checked
        self._row_starts = (np.arange(DICT_ROWS) * self.width)[
            None, :
        ]  # (1, DICT_ROWS): row r's first column
        self._one_row = (
            OneRowTransform(
                self.lookups, self._lift, self._column, self.width, self._transform, self, self._table
            )
            if self._counts_after_lifts
            else None
        )

    def probe(self) -> RawBatch:
        """Two rows for a load check when warm-up has none: all missing, and each field's first table value."""
        known = [min((v for v in lookup if v), default="") for lookup in self.lookups]
        numeric = np.array([[np.nan] * N_NUM, [3.0] * N_NUM]).T
        return RawBatch(numeric, np.array([[""] * len(known), known], dtype=object).T.copy())

    @classmethod
    def load(cls, path: Path) -> RawTransform:
        """From a version's `assets.extra/feature_spec.json`."""
        return cls(json.loads(path.read_text()))

    def entries(self, batch: RawBatch) -> np.ndarray:
        """The batch's (26, N) values -> (26, N) entry indices (0 where the field's tables hold no such value):
        by dict up to DICT_ROWS rows, else with the batch's keys (RawBatch.keys)."""
        n = len(batch)
        known = batch.known_keys()
        if n > DICT_ROWS or (known is not None and known.slow is None):  # keyed rows: their values unread
            keys = batch.keys
            if keys is not None and keys.slow is None:  # every value keyed: the strings are not read
                return self._table.lookup_keys(keys)
            return self._table.lookup(batch.categorical, keys)
        # One C-level pass over every value: dict.get(field's dict, value, 0), field by field.
        tables = self.lookups if n == 1 else chain.from_iterable(repeat(lookup, n) for lookup in self.lookups)
        found = map(dict.get, tables, batch.strings(), repeat(0))
        return np.fromiter(found, np.intp, len(CATEGORICAL_FIELDS) * n).reshape(len(CATEGORICAL_FIELDS), n)

    def __call__(self, batch: RawBatch) -> np.ndarray:
        """The batch's float32 (N, width) features, equal to `FeatureSpec.transform` of its rows."""
        return self._one_row.transform(batch) if self._one_row is not None else self._transform(batch)

    def serving_call(self) -> Callable[[RawBatch], np.ndarray]:
        """What a server's runner calls per batch (the same features as `self(batch)`): the few-row transform,
        which sends a batch it does not take to the numpy transform, so a few rows take no hop through here."""
        return self._one_row.transform if self._one_row is not None else self._transform

    def _transform(self, batch: RawBatch) -> np.ndarray:
        """The numpy transform of any batch; the categorical columns of a larger keyed one natively (the
        few-row transform's lookups, lifts and bucket counts: `OneRowTransform.categorical`)."""
        n = len(batch)
        native = self._one_row.categorical(batch) if n > DICT_ROWS and self._one_row is not None else None
        if native is None:
            out, entries = self._categorical(batch, n)
        else:
            out, entries = native
        batch.remember_entries(self, entries)
        # No np.errstate (a context manager per call): counts are within ±2**53 or NaN/±Inf, and none of these operations makes
        # a NaN or an overflow from them (log1p(inf) = inf, and NaN propagates without a warning).
        x = batch.numeric
        v = np.sign(x) * np.log1p(np.abs(x))  # signed_log1p (ctr_features/layout.py)
        missing = ~np.isfinite(v)
        # The spec's expressions, elementwise, in float64: the same numbers in either layout. A missing
        # value's z is replaced by 0 before the clip, so it need not be zeroed before the z-score too.
        z = np.where(missing, 0.0, (v - self._mean) / self._std)
        out[:, :N_NUM] = np.minimum(np.maximum(z, -self._clip), self._clip).T  # np.clip, without its wrapper
        out[:, N_NUM:LIFT_START] = missing.T
        return out

    def _categorical(self, batch: RawBatch, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The float32 (N, width) features with the categorical columns filled (lifts, bucket counts; every
        other column 0), and the (26, N) entries, in numpy."""
        entries = self.entries(batch)
        hits = self._column[entries]  # (26, N): the column each value counts in
        if n <= DICT_ROWS and self._counts_after_lifts:
            # Few rows: the bucket counts of every row at once, as the output's first values (~3 numpy calls
            # instead of add.at's ~6); exact, as every hit is in a column no other part writes.
            counts = np.bincount((hits + self._row_starts[:, :n]).ravel(), minlength=n * self.width)
            out = counts.astype(np.float32).reshape(n, self.width)
        else:
            out = np.zeros((n, self.width), np.float32)
            # Every (row, column) hit, counted at once (two fields may share a bucket; the counts are small
            # integers, exact in float32). numpy >= 1.25's add.at, several times faster than bincount here.
            np.add.at(out.reshape(-1), (hits + np.arange(n) * self.width).ravel(), np.float32(1))
        out[:, LIFT_START:HASH_START] = self._lift[entries].T
        return out, entries
