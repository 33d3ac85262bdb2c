"""Views and clicks per distinct categorical value, counted on Arrow dictionaries and merged exactly.

This is the mergeable half of the fit (`ctr_features.fit` holds the rest). Parquet stores each row
group's categorical columns as a dictionary of distinct values plus one index per row; read as such
(`ParquetData.read_splits(..., dictionary=True)`), a chunk is counted with `bincount` over the indices,
without touching a string per row. Chunks, and the tables of other ranks, merge by a hash group-by on the
value. Views and 0/1 click sums are integers, so the merged counts are exact in any order. Memory is the
distinct values seen (measured: about 110 bytes per value at peak, merges and the final sort included),
never the rows, and at most `MAX_VALUES` per field: a field with more distinct values keeps its most
viewed ones and its counts become approximate (the fit then says so, with the bound).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctr_features.compiled.records import dictionary_parts
from ctr_features.fit import Counts

_COLUMNS = ("value", "views", "clicks")
# Distinct values a field keeps (~110 bytes each at peak, measured): past this, the least viewed half is
# dropped. Exact below it; above it a value's views may fall short by at most `FieldCounts.error`.
MAX_VALUES = 1 << 18


def _as_table(values: pa.Array, views: np.ndarray, clicks: np.ndarray) -> pa.Table:
    return pa.table({"value": values, "views": pa.array(views, pa.int64()), "clicks": pa.array(clicks)})


def merge_tables(tables: Sequence[pa.Table]) -> pa.Table:
    """One table of distinct values whose views and clicks are the sums over `tables` (exact: integers)."""
    grouped = pa.concat_tables(tables).group_by("value").aggregate([("views", "sum"), ("clicks", "sum")])
    return grouped.select(["value", "views_sum", "clicks_sum"]).rename_columns(list(_COLUMNS))


class FieldCounts:
    """One field's value counts; `add` chunks (or other ranks' tables), read the merged `table()`."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []
        self._merged = 0  # distinct values in the last merged table
        self._pending = 0  # value entries added since
        self.error = 0  # most views any value may have lost to the cap (0: exact)

    def add(self, column: pa.ChunkedArray | pa.Array, labels: np.ndarray) -> None:
        """Count one chunk: values (string, binary or dictionary), labels float64 0/1 [N]."""
        at = 0
        for values, index in dictionary_parts(column):
            y = labels[at : at + index.size]
            at += index.size
            views = np.bincount(index, minlength=len(values))
            clicks = np.bincount(index, weights=y, minlength=len(values))
            seen = np.flatnonzero(views)  # a row group's dictionary also holds the other split's values
            self.add_table(_as_table(values.take(pa.array(seen)), views[seen], clicks[seen]))

    def add_table(self, table: pa.Table) -> None:
        """Merge in counts made elsewhere (another rank's `table()`)."""
        self._parts.append(table)
        self._pending += len(table)
        if self._pending > max(self._merged, 1 << 18):  # merge when the parts outgrow the merged table
            self._merge()

    def _merge(self) -> None:
        if self._pending:
            merged = merge_tables(self._parts)
            if (
                len(merged) > MAX_VALUES
            ):  # keep the most viewed half; ties by value, so the cut is deterministic
                order = pc.sort_indices(merged, [("views", "descending"), ("value", "ascending")])
                dropped = merged.column("views").take(order[MAX_VALUES // 2 :])
                self.error += int(pc.max(dropped).as_py())  # a later-seen value lost at most this per cut
                merged = merged.take(order[: MAX_VALUES // 2])
            self._parts = [merged]
            self._merged, self._pending = len(merged), 0

    def table(self) -> pa.Table:
        """The merged counts: value binary, views int64, clicks float64, one row per distinct value."""
        self._merge()
        if not self._parts:
            return _as_table(pa.array([], pa.binary()), np.zeros(0, np.int64), np.zeros(0))
        return self._parts[0]

    def counts(self, min_views: int) -> Counts:
        """Values seen at least `min_views` times, sorted by their bytes, as `fit_field_table` takes them.

        Dropping rarer values changes nothing the fit keeps when `min_views` is at most both the vocabulary's
        and the rate table's minimum count: their top-k ranking only ever looks at values above those.
        """
        t = self.table()
        t = t.filter(pc.greater_equal(t.column("views"), min_views))
        t = t.take(pc.sort_indices(t, [("value", "ascending")]))  # bytewise, like numpy's 'S' sort
        values = t.column("value").to_numpy(zero_copy_only=False)  # object array of bytes
        return values, t.column("views").to_numpy().astype(np.int64), t.column("clicks").to_numpy()
