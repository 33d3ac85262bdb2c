"""The compiled FeatureSpec for a few rows: a single raw row costs about what a vector does.

Keyed rows of up to DICT_ROWS (every value up to 8 ASCII characters, whichever decoder made them: their keys
come from the native scan or `RawKeys.of_list`) go through the native few-row transform
(ctr_features/compiled/_table_native.c, `rows`): the 26 lookups in the same table as the numpy path, the
lifts and the bucket counts, in C, with the counts' z-scores taken from the cache below. A single row with
other values (longer, or not ASCII) is done in Python:

On one row the numpy transform (ctr_features/compiled/table.py) is ~20 calls on tiny arrays, each with its
fixed cost, and slower once the model has run in between (its temporaries evict the model's data). Here the
26 lookups are dict gets and the row is one list turned into one float32 array. The counts' z-scores must stay numpy's bits
(numpy's log1p is not Python's), so they come from a bounded cache of what the numpy transform gave for each
(field, count) before: a count not seen yet (or a spec whose bucket columns are not all after the lifts)
sends the row to the numpy transform, whose results then fill the cache. Checked bit for bit against
`FeatureSpec.transform` with the rest of the compiled spec (tests/serving/codecs/test_unit_raw_fast.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from itertools import chain, repeat
from types import MethodType
from typing import Any, cast

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.value_table import ValueTable
from ctr_features.layout import LIFT_START, N_NUM

try:
    from ctr_features.compiled._table_native import cells as _native_cells
    from ctr_features.compiled._table_native import rows as _native_rows
    from ctr_features.compiled._table_native import table as _native_table
except ImportError:  # not built (pip install -e . builds it): the Python one-row path and numpy serve alone
    _native_cells = _native_rows = _native_table = None
# Up to this many rows a dict per field beats the batch-wide table (its ~20 numpy calls' fixed costs).
DICT_ROWS = 16
CACHED_COUNTS = 4096  # per field: the small counts most rows carry; rarer ones take the numpy path
_NO_ENTRY = [0] * len(CATEGORICAL_FIELDS)


class OneRowTransform:
    """`transform(batch)` for a one-row RawBatch, equal to the numpy transform `full` it falls back to."""

    def __init__(
        self,
        lookups: list[dict[str, int]],
        lift: np.ndarray,
        column: np.ndarray,
        width: int,
        full: Callable[[RawBatch], np.ndarray],
        owner: object,
        table: ValueTable | None = None,
    ) -> None:
        """`lookups`, `lift`, `column`: RawTransform's entries (value -> entry; entry -> lift, column);
        `owner`: the RawTransform whose entries these are (RawBatch.remember_entries); `table`: its lookups'
        ValueTable, for the native transform of keyed rows (None: not used)."""
        self._native = None
        if table is not None and _native_table is not None:
            key, code, salts, shift, default = table.arrays()
            self._native = _native_table(
                key.tobytes(),
                code.tobytes(),
                salts.tobytes(),
                shift,
                default,
                lift.astype(np.float32).tobytes(),
                column.astype(np.int32).tobytes(),
                width,
            )
        self._lookups, self._width = lookups, width
        # Weak: `owner` holds this object and `full` is its method, so strong references back would make a
        # cycle that only a full collection frees: an unloaded version's tables stayed for good in a server
        # that rarely runs one (docs/perf/serving-memory.md).
        self._full_method = weakref.WeakMethod(cast(MethodType, full))
        self._owner = weakref.ref(owner)
        # As Python lists for the Python path (float32 values, exact as Python floats), made at its first row:
        # most versions never take it, and 100k-entry specs' lists are megabytes of objects.
        self._lift_array, self._column_array = lift, column
        self._lists: tuple[list[float], list[int]] | None = None
        self._lifts_at = LIFT_START  # the layout: z-scores, missing flags, lifts, then bucket counts
        self._counts_at = self._lifts_at + len(lookups)
        self._z: list[dict[float, float]] = [{} for _ in range(N_NUM)]  # count -> its float32 z-score

    def transform(self, batch: RawBatch) -> np.ndarray:
        """Any batch's float32 (N, width) features: keyed rows up to DICT_ROWS natively (`keyed`), one other
        row in Python, every other batch by the numpy transform."""
        n = len(batch)
        if n <= DICT_ROWS and self.takes(batch):
            return self.keyed(batch)
        if n == 1:
            return self(batch)
        return self._full(batch)

    def __call__(self, batch: RawBatch) -> np.ndarray:
        """The row's float32 (1, width) features."""
        counts = batch.numeric[:, 0].tolist()
        z: list[Any] = list(map(dict.get, self._z, counts))  # NaN (missing) is never found: see below
        missing = [0.0] * N_NUM
        if None in z:
            for j, value in enumerate(counts):
                if z[j] is None:
                    if value == value:  # a count not cached yet
                        return self._fill(batch, counts)
                    z[j], missing[j] = 0.0, 1.0
        row = [0.0] * self._width
        row[:N_NUM] = z
        row[N_NUM : self._lifts_at] = missing
        entries = list(map(dict.get, self._lookups, batch.strings(), _NO_ENTRY))
        batch.remember_entries(self._owner(), entries)
        if self._lists is None:
            self._lists = self._lift_array.tolist(), self._column_array.tolist()
        lifts, columns = self._lists
        row[self._lifts_at : self._counts_at] = map(lifts.__getitem__, entries)
        for column in map(columns.__getitem__, entries):
            row[column] += 1.0  # two fields may share a bucket
        return np.array([row], np.float32)

    def takes(self, batch: RawBatch) -> bool:
        """Whether `keyed` can transform the batch: every value keyed (any batch whose values are all up to 8
        ASCII characters: the scan's, the exact path's, gRPC's), and the native transform built."""
        if self._native is None:
            return False
        keys = batch.keys  # the decoder's, or made now (in C)
        return keys is not None and keys.slow is None

    def keyed(self, batch: RawBatch) -> np.ndarray:
        """The float32 (N, width) features of a keyed batch (`takes`), natively; a count whose z-score is not
        cached yet sends the batch to the numpy transform, whose results then fill the cache."""
        n = len(batch)
        numeric = np.ascontiguousarray(batch.numeric)
        counts = numeric.ravel().tolist()  # field-major
        caches = self._z if n == 1 else chain.from_iterable(repeat(cache, n) for cache in self._z)
        z = list(map(dict.get, caches, counts))
        key = np.ascontiguousarray(batch.keys.key)  # type: ignore[union-attr]
        found = _native_rows(self._native, z, numeric, key, n)  # type: ignore[misc]
        if found is None:
            return self._fill(batch, counts)
        features, entries = found
        # (26, N) as a view of the (N, 26) rows: a merged batch's single-row parts get contiguous columns, whose
        # bytes drift joins (serving/observability/drift.py)
        rows = np.frombuffer(entries, np.int32).reshape(n, len(CATEGORICAL_FIELDS))
        batch.remember_entries(self._owner(), rows.T)
        return np.frombuffer(features, np.float32).reshape(n, self._width)

    def categorical(self, batch: RawBatch) -> tuple[np.ndarray, np.ndarray] | None:
        """For the numpy transform of a keyed batch (`takes`) of any size: its float32 (N, width) features with
        the categorical columns filled natively (lifts, bucket counts; every other column 0), and its (26, N)
        entries (a view of row-major ones, as `keyed` leaves them); None when the batch is not keyed."""
        if not self.takes(batch):
            return None
        n = len(batch)
        rows = np.ascontiguousarray(batch.keys.key.T)  # type: ignore[union-attr]  # a merged batch's: no copy
        features, entries = _native_cells(self._native, rows, n)  # type: ignore[misc]
        found = np.frombuffer(entries, np.int32).reshape(n, len(CATEGORICAL_FIELDS)).T
        return np.frombuffer(features, np.float32).reshape(n, self._width), found

    def _full(self, batch: RawBatch) -> np.ndarray:
        """The owner's numpy transform of the batch."""
        full = self._full_method()
        assert full is not None, "the RawTransform that owns this one-row transform is gone"
        return full(batch)

    def _fill(self, batch: RawBatch, counts: list[float]) -> np.ndarray:
        """The numpy transform of the batch; its present counts' z-scores join the cache (while there is room).
        `counts`: the batch's counts field-major."""
        out = self._full(batch)
        n = len(batch)
        for i, value in enumerate(counts):
            j, r = divmod(i, n)
            cache = self._z[j]
            if len(cache) < CACHED_COUNTS and out[r, N_NUM + j] == 0:  # present (not NaN, nor infinite)
                cache[value] = float(out[r, j])
        return out
