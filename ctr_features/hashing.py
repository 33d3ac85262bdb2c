"""Stable string hashing in numpy: 32-bit FNV-1a over UTF-8 bytes, vectorised over many strings.

Python's `hash()` is salted per process, so it can never decide a feature bucket. FNV-1a is simple
enough to reimplement anywhere (serving, SQL, another language) and gives the same bucket everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

FNV_OFFSET = 0x811C9DC5
FNV_PRIME = 0x01000193

# A column of strings as Arrow lays it out: all UTF-8 bytes back to back, plus N+1 offsets.
StringColumn = tuple[np.ndarray, np.ndarray]


def fnv1a_32(text: str) -> int:
    """FNV-1a of one string; the scalar reference the vectorised version must match."""
    h = FNV_OFFSET
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return h


def encode_strings(values: Iterable[object]) -> StringColumn:
    """Pack strings into (uint8 bytes, int64 offsets); None and NaN count as the empty (missing) string."""
    encoded = [
        b"" if v is None or (isinstance(v, float) and v != v) else str(v).encode("utf-8") for v in values
    ]
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return data, offsets


def fnv1a_column(column: StringColumn, prefix: str = "") -> np.ndarray:
    """FNV-1a of `prefix + value` for every string in the column.

    Args:
        column: (data uint8 [total_bytes], offsets int64 [N+1]).
        prefix: text hashed before every value, e.g. the field name "C6:".
    Returns:
        uint32 [N] hashes.
    """
    data, offsets = column
    offsets = np.asarray(offsets, dtype=np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    h = np.full(starts.shape[0], fnv1a_32(prefix), dtype=np.uint32)
    prime = np.uint32(FNV_PRIME)
    # Loop over byte position, vectorised over strings: Criteo values are 8 bytes, so ~8 passes.
    for k in range(int(lengths.max(initial=0))):
        active = np.flatnonzero(lengths > k)
        byte = data[starts[active] + k].astype(np.uint32)
        h[active] = (h[active] ^ byte) * prime
    return h
