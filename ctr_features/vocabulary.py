"""Per-field categorical tables keyed by the value itself: a bounded vocabulary and a click-rate table (numpy).

Serving graphs apply these tables with standard ops (ONNX `ai.onnx.ml.LabelEncoder`, TF `StaticHashTable`):
a string -> number lookup with a default. Hashing arbitrary strings (FNV) has no standard ONNX op, so no
vector column may depend on the hash of a value the graph has not seen at export time. The hash is computed
once per vocabulary entry at fit time and stored as that entry's bucket.

Both tables are built from per-field value counts (views and clicks per value) only, so a streaming fit that
merges counts chunk by chunk gets exactly the same tables: see `fit_field_table`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ctr_features.hashing import StringColumn, encode_strings, fnv1a_column

# Fixed-width bytes ('S') arrays sort and compare in C; values with NUL bytes or longer than this fall back to
# Python bytes objects (numpy strips trailing NULs from 'S' values, which would merge distinct values).
_MAX_FIXED_BYTES = 256


def value_array(column: StringColumn) -> np.ndarray:
    """The column's values as a sortable array: 'S' bytes when exact, else object `bytes`. Missing = b''."""
    data, offsets = column
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    width = int(lengths.max(initial=0))
    if width <= _MAX_FIXED_BYTES and not np.any(data == 0):
        if width == 0:
            return np.zeros(lengths.size, dtype="S1")
        # (N, width) byte matrix, zero padded, viewed as N fixed-width strings.
        cols = np.arange(width)
        inside = cols[None, :] < lengths[:, None]
        idx = np.where(inside, offsets[:-1, None] + cols[None, :], 0)
        mat = np.where(inside, data[idx] if data.size else 0, 0).astype(np.uint8)
        return np.ascontiguousarray(mat).view(f"S{width}").reshape(-1)
    raw = data.tobytes()
    return np.array([raw[a:b] for a, b in itertools.pairwise(offsets.tolist())] + [None], object)[:-1]


def value_counts(values: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct values (sorted), their views int64 and clicks float64: the mergeable per-field statistic."""
    uniq, inverse, views = np.unique(values, return_inverse=True, return_counts=True)
    clicks = np.bincount(inverse.reshape(-1), weights=np.asarray(labels, np.float64), minlength=uniq.size)
    return uniq, views.astype(np.int64), clicks


def _top(values: np.ndarray, views: np.ndarray, min_count: int, limit: int) -> np.ndarray:
    """Indices of the `limit` most viewed values with >= min_count views; ties go to the smaller value."""
    keep = np.flatnonzero(views >= min_count)
    if keep.size > limit:
        # `values` is sorted, so a stable sort by -views breaks ties by value: independent of chunking.
        keep = keep[np.argsort(-views[keep], kind="stable")[:limit]]
    return np.sort(keep)


def _sorted_object(values: np.ndarray) -> np.ndarray:
    """Values as a sorted object array of `bytes` (the portable form the tables keep)."""
    out = np.array([bytes(v) for v in values] + [None], dtype=object)[:-1]
    return out[np.argsort(out, kind="stable")] if out.size else out


@dataclass(frozen=True)
class FieldTable:
    """One categorical field: vocabulary values -> hashed bucket, frequent values -> click-rate lift.

    `vocab` and `rate_values` are sorted object arrays of UTF-8 `bytes`; `bucket` is int64 in [0, n_buckets).
    """

    field: str
    vocab: np.ndarray
    bucket: np.ndarray
    rate_values: np.ndarray
    lift: np.ndarray

    @classmethod
    def build(
        cls, field: str, vocab: np.ndarray, rate_values: np.ndarray, lift: np.ndarray, n_buckets: int
    ) -> FieldTable:
        """Derive each vocabulary entry's bucket: fnv1a_32(utf8(field + ':' + value)) % n_buckets."""
        vocab = _sorted_object(vocab)
        order = np.argsort(np.array([bytes(v) for v in rate_values] + [None], object)[:-1], kind="stable")
        rate_values, lift = _sorted_object(rate_values), np.asarray(lift, np.float64)[order]
        for name, arr in (("vocabulary", vocab), ("rate table", rate_values)):
            if arr.size > 1 and np.any(arr[1:] == arr[:-1]):
                raise ValueError(f"{field} {name} repeats a value")
        if not np.all(np.isfinite(lift)) or lift.shape != rate_values.shape:
            raise ValueError(f"{field} rate table needs one finite lift per value")
        hashes = fnv1a_column(encode_strings(v.decode("utf-8") for v in vocab), prefix=f"{field}:")
        bucket = (hashes % np.uint32(n_buckets)).astype(np.int64)
        return cls(field, vocab, bucket, rate_values, lift)

    def lookup(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per value: (bucket int64, -1 when out of vocabulary; lift float64, 0.0 when not in the rate table)."""
        return _find(self.vocab, self.bucket, values, -1), _find(self.rate_values, self.lift, values, 0.0)

    def to_dict(self) -> dict[str, list]:  # type: ignore[type-arg]
        return {
            "vocabulary": [v.decode("utf-8") for v in self.vocab],
            "rate_values": [v.decode("utf-8") for v in self.rate_values],
            "rate_lift": self.lift.tolist(),
        }

    @classmethod
    def from_dict(cls, field: str, d: dict[str, list], n_buckets: int) -> FieldTable:  # type: ignore[type-arg]
        enc = [
            np.array([s.encode("utf-8") for s in d[k]] + [None], object)[:-1]
            for k in ("vocabulary", "rate_values")
        ]
        return cls.build(field, enc[0], enc[1], np.asarray(d["rate_lift"], np.float64), n_buckets)


def _find(keys: np.ndarray, out: np.ndarray, values: np.ndarray, default: float) -> np.ndarray:
    """out[i] where keys[i] == value, else default; keys sorted object bytes, values 'S' or object bytes."""
    result = np.full(values.shape[0], default, dtype=out.dtype)
    if keys.size == 0 or values.size == 0:
        return result
    if values.dtype.kind == "S":
        # Compare as fixed-width bytes. A key with a NUL byte cannot equal a NUL-free 'S' value: drop it.
        ok = np.array([b"\0" not in k for k in keys], dtype=bool)
        width = max(values.dtype.itemsize, max((len(k) for k in keys), default=1))
        keys_s, out = keys[ok].astype(f"S{width}"), out[ok]
        values = values.astype(f"S{width}")
    else:
        keys_s = keys
    if keys_s.size == 0:
        return result
    pos = np.minimum(np.searchsorted(keys_s, values), keys_s.size - 1)
    hit = keys_s[pos] == values
    result[hit] = out[pos[hit]]
    return result


def fit_field_table(
    field: str,
    values: np.ndarray,
    views: np.ndarray,
    clicks: np.ndarray,
    prior: float,
    n_buckets: int,
    vocab_size: int,
    vocab_min_count: int,
    min_count: int,
    smoothing: float,
    max_entries: int,
) -> FieldTable:
    """Build one field's tables from its value counts (exact under any chunking of the training rows).

    Args:
        values: distinct values, sorted ('S' or object bytes); views int64 and clicks float64 per value.
        prior: the overall click rate p.
        n_buckets: hashed buckets for vocabulary values.
        vocab_size / vocab_min_count: keep the `vocab_size` most viewed values seen >= vocab_min_count times.
        min_count / smoothing / max_entries: rate table settings. lift = log((clicks + a*p) /
            (views - clicks + a*(1-p))) - log(p/(1-p)) with a = smoothing, for the `max_entries` most viewed
            values with >= min_count views (a high min_count keeps a row's own label from leaking into it).
    """
    vocab = values[_top(values, views, vocab_min_count, vocab_size)]
    keep = _top(values, views, min_count, max_entries)
    a = smoothing
    odds = (clicks[keep] + a * prior) / (views[keep] - clicks[keep] + a * (1.0 - prior))
    lift = np.log(odds) - np.log(prior / (1.0 - prior))
    return FieldTable.build(field, vocab, values[keep], lift, n_buckets)
