"""The compiled FeatureSpec for a batch of one row, in Python scalars: a single raw row costs about what a vector does.

On one row the numpy transform (serving/codecs/raw_transform.py) is ~20 calls on tiny arrays, ~12 µs, and
more once the model has run in between (its temporaries evict the model's data). Here the 26 lookups are dict
gets and the row is one list turned into one float32 array. The counts' z-scores must stay numpy's bits
(numpy's log1p is not Python's), so they come from a bounded cache of what the numpy transform gave for each
(field, count) before: a count not seen yet (or a spec whose bucket columns are not all after the lifts)
sends the row to the numpy transform, whose results then fill the cache. Checked bit for bit against
`FeatureSpec.transform` with the rest of the compiled spec (tests/serving/unit/test_unit_raw_fast.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from serving.batches import RawBatch

N_NUM = len(NUMERIC_FIELDS)
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
    ) -> None:
        """`lookups`, `lift`, `column`: RawTransform's entries (value -> entry; entry -> lift, column);
        `owner`: the RawTransform whose entries these are (RawBatch.remember_entries)."""
        self._lookups, self._width, self._full, self._owner = lookups, width, full, owner
        self._lift: list[float] = lift.tolist()  # float32 values, exact as Python floats
        self._column: list[int] = column.tolist()
        self._lifts_at = 2 * N_NUM  # the layout: z-scores, missing flags, lifts, then bucket counts
        self._counts_at = self._lifts_at + len(lookups)
        self._z: list[dict[float, float]] = [{} for _ in range(N_NUM)]  # count -> its float32 z-score

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
        batch.remember_entries(self._owner, entries)
        row[self._lifts_at : self._counts_at] = map(self._lift.__getitem__, entries)
        for column in map(self._column.__getitem__, entries):
            row[column] += 1.0  # two fields may share a bucket
        return np.array([row], np.float32)

    def _fill(self, batch: RawBatch, counts: list[float]) -> np.ndarray:
        """The numpy transform of the row; its present counts' z-scores join the cache (while there is room)."""
        out = self._full(batch)
        for j, value in enumerate(counts):
            cache = self._z[j]
            if len(cache) < CACHED_COUNTS and out[0, N_NUM + j] == 0:  # present (not NaN, nor infinite)
                cache[value] = float(out[0, j])
        return out
