"""The fuzz targets of the native code: one per entry point (scan, keys, table, rows) and a differential one.

Each target takes the fuzzer's bytes and raises (an AssertionError) on a wrong answer; a memory error or
undefined behaviour aborts under the sanitizer build (fuzz/run.py loads it). `load_native(folder)` puts the
extensions built in `folder` (the ASan + UBSan build of `make fuzz`) in place of the in-place ones before
the project's modules import them; without it, the normal build runs (tests/serving/codecs/
test_unit_raw_native_corpus.py replays the corpus that way).

- scan: any body, any row bounds: None, or (n, counts, keys, columnar) of consistent sizes;
- keys: lists of str (and other objects): None exactly when a value is not keyable, else each value's key;
- table: arbitrary arrays at any alignment and any width: a ValueError/OverflowError, or a table that
  `rows` then runs on;
- rows: a valid table, z lists of floats, None and objects whose __float__ mutates the list, any n:
  the features and entries of a plain Python transform, or the errors its checks name;
- differential: whatever the scan accepts decodes to exactly what the exact path decodes (counts bit for
  bit, NaN for missing, keys), and whatever the exact path rejects the scan declines.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import struct
import sys
from pathlib import Path
from typing import Any

NAMES = ("scan", "keys", "table", "rows", "cells", "differential")
MODULES = ("ctr_features.compiled._table_native", "serving.codecs._scan_native")
N_NUM, N_CAT, HASH_START = 13, 26, 52
EMPTY_KEY = 0x0101010101010101
MIX, MIX2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
ERRORS = {
    "n is too large",
    "n * width is too large",
    "z, counts and keys must hold 13, 13 and 26 values per row",
    "keys must hold 26 values per row, of at least one row",
}


def load_native(folder: str | None) -> None:
    """The extensions of `folder` (its package layout: ctr_features/compiled/_table_native.so, ...) as the
    project's, before anything imports them; None: the normal in-place build."""
    if folder is None:
        return
    for name in MODULES:
        path = Path(folder, *name.split(".")).with_suffix(".so")
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules[name] = module


class Bytes:
    """The fuzzer's bytes as a stream of small decisions (zeros once spent)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += n
        return out.ljust(n, b"\0")

    def int(self, n: int = 1) -> int:
        return int.from_bytes(self.take(n), "little")

    def rest(self) -> bytes:
        out = self.data[self.at :]
        self.at = len(self.data)
        return out


def key_of(value: str) -> int | None:
    """ctr_features/compiled/raw_key.h's key of a value, or None when the value is not keyable."""
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > 8 or any(c < 2 or c >= 0x80 for c in raw):
        return None
    return int.from_bytes(raw, "little") if raw else EMPTY_KEY


def fuzz_scan(data: bytes) -> None:
    from serving.codecs._scan_native import scan

    if not data:
        return
    bounds = data[0]
    body = data[1:]
    min_rows, max_rows = bounds & 3, (65536, 1, 2, 7)[bounds >> 2 & 3]
    found = scan(body, min_rows, max_rows)
    if found is None:
        return
    n, counts, keys, columnar = found
    assert max(1, min_rows) <= n <= max_rows and type(columnar) is bool
    assert len(counts) == N_NUM * n * 8 and len(keys) == N_CAT * n * 8
    assert all(c == c or (bits >> 52 & 0x7FF) == 0x7FF for c, bits in zip(*_doubles(counts), strict=True))


def _doubles(data: bytes | bytearray) -> tuple[list[float], list[int]]:
    n = len(data) // 8
    return list(struct.unpack(f"<{n}d", data)), list(struct.unpack(f"<{n}Q", data))


class Odd:
    """A value that is not a str: keys() must say None, not crash."""


def fuzz_keys(data: bytes) -> None:
    from ctr_features.compiled._table_native import keys

    values: list[Any] = []
    for part in data.split(b"\xff"):
        kind = part[:1]
        if kind == b"\xfe":
            values.append(Odd() if len(part) % 2 else part[1:])
        elif kind == b"\xfd":
            values.append(part[1:].decode("utf-16-le", "surrogatepass") if len(part) % 2 else len(part))
        else:
            values.append(part.decode("latin-1"))
    found = keys(values)
    want = [key_of(v) if type(v) is str else None for v in values]
    if None in want:
        assert found is None, values
    else:
        assert found is not None and list(struct.unpack(f"<{len(values)}Q", found)) == want


def _buffer(raw: bytes, offset: int) -> memoryview:
    """`raw` at `offset` bytes past an aligned start: `y*` takes any contiguous buffer."""
    return memoryview(b"\0" * offset + raw)[offset:]


def fuzz_table(data: bytes) -> None:
    from ctr_features.compiled._table_native import table

    b = Bytes(data)
    shift, width = 58 + b.int() % 7, (53, 54, 128, 1 << 20, (1 << 20) + 1, 52, 0, sys.maxsize)[b.int() % 8]
    slots, entries, flags = 1 << (64 - min(shift, 63)), b.int() % 6, b.int()
    sizes = [slots * 8, slots * 4, N_CAT * 8, entries * 4, entries * 4]
    sizes = [b.int(2) % 1100 if flags >> i & 1 else s for i, s in enumerate(sizes)]  # a bit set: any size
    default = b.int() % 5 - 1
    offsets = [b.int() % 8 for _ in range(5)]
    raw = [b.take(s) for s in sizes]
    if not flags & 32:  # codes that are entries (else any)
        raw[1] = _ints(raw[1], lambda c: c % max(entries, 1))
    if not flags & 64:  # bucket columns within the width (else any)
        top = max(min(width, 1 << 20) - HASH_START, 1)
        raw[4] = _ints(raw[4], lambda c: HASH_START + c % top)
    args = [_buffer(r, o) for r, o in zip(raw, offsets, strict=True)]
    try:
        built = table(args[0], args[1], args[2], shift, default, args[3], args[4], width)
    except (ValueError, OverflowError) as exc:
        assert str(exc), exc
        return
    assert 53 <= width <= 1 << 20
    fuzz_rows_on(built, b, width, raw, default, shift)


def _ints(raw: bytes, fix: Any) -> bytes:
    """`raw`'s uint32s, each mapped by `fix`, as int32s (a trailing partial one dropped)."""
    return b"".join(
        fix(c).to_bytes(4, "little", signed=True)
        for c in struct.unpack(f"<{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    )


def _lookup(key: bytes, code: bytes, salts: bytes, default: int, shift: int, value: int, field: int) -> int:
    salt = int.from_bytes(salts[field * 8 : field * 8 + 8], "little")
    salted = value ^ salt
    for mix in (MIX, MIX2):
        slot = (salted * mix % 2**64) >> shift
        if int.from_bytes(key[slot * 8 : slot * 8 + 8], "little") == salted:
            return int.from_bytes(code[slot * 4 : slot * 4 + 4], "little", signed=True)
    return default


class Shrinker:
    """A z-score whose __float__ clears, shrinks or grows the `z` list while rows() reads it."""

    def __init__(self, z: list[Any], how: int, value: float) -> None:
        self.z, self.how, self.value = z, how, value

    def __float__(self) -> float:
        if self.how == 0:
            self.z.clear()
        elif self.how == 1:
            del self.z[: len(self.z) // 2]
        else:
            self.z.extend([None] * 64)
        return self.value


def fuzz_rows_on(built: Any, b: Bytes, width: int, raw: list[bytes], default: int, shift: int) -> None:
    """rows() on a table built from `raw` (key, code, salts, lift, column), against a plain Python transform."""
    from ctr_features.compiled._table_native import rows

    mode = b.int()
    n = real = 1 + b.int() % 4  # the arrays' rows; `n` may claim others
    if mode % 5 == 0:  # sizes that wrap or overflow, or do not match
        huge = (0, -1, sys.maxsize // 13 + 1, sys.maxsize // 208 + 1, sys.maxsize // (width * 4) + 1, n)
        n = huge[b.int() % 6]
    counts_n, keys_n, z_n = real, real, real
    if mode % 7 == 1:
        counts_n, keys_n, z_n = (counts_n + b.int() % 2, keys_n + b.int() % 2, z_n + b.int() % 2)
    z: list[Any] = []
    for _ in range(N_NUM * z_n):
        pick = b.int()
        if pick < 64:
            z.append(None)
        elif pick < 72:
            z.append(Shrinker(z, pick % 3, float(pick)))
        elif pick < 76:
            z.append("x")
        else:
            z.append(struct.unpack("<f", b.take(4))[0])
    counts = [
        struct.unpack("<d", b.take(8))[0] if b.int() % 8 == 0 else math.nan for _ in range(N_NUM * counts_n)
    ]
    key, code, salts, lift, column = raw
    slots = len(key) // 8
    keyed = []
    for i in range(N_CAT * keys_n):
        pick = b.int() % 4
        if pick == 0:
            keyed.append(b.int(8))
        elif pick == 1:
            keyed.append(EMPTY_KEY)
        else:  # a key the table holds for this field, so the lookup hits (in either slot)
            slot, f = b.int(2) % slots, min(i // keys_n, N_CAT - 1)
            salt = int.from_bytes(salts[f * 8 : f * 8 + 8], "little")
            keyed.append(int.from_bytes(key[slot * 8 : slot * 8 + 8], "little") ^ salt)
    counts_raw, keys_raw = struct.pack(f"<{len(counts)}d", *counts), struct.pack(f"<{len(keyed)}Q", *keyed)
    items = list(z)  # rows() reads its own copy: the answer is the list as it was
    try:
        found = rows(built, z, _buffer(counts_raw, b.int() % 8), _buffer(keys_raw, b.int() % 8), n)
    except OverflowError as exc:
        assert str(exc) in ERRORS and n > 1 << 40, (str(exc), n)
        return
    except ValueError as exc:
        assert str(exc) in ERRORS and (n < 1 or (counts_n, keys_n, z_n) != (n, n, n)), (str(exc), n)
        return
    except TypeError as exc:
        assert "x" in items, exc
        return
    assert (counts_n, keys_n, z_n) == (n, n, n) and n >= 1
    if found is None:
        assert any(v is None and c == c for v, c in zip(items, counts, strict=True))
        return
    features, entries = found
    assert len(features) == n * width * 4 and len(entries) == n * N_CAT * 4
    out = [[0.0] * width for _ in range(n)]
    for j in range(N_NUM):
        for r in range(n):
            v = items[j * n + r]
            if v is None:
                out[r][N_NUM + j] = 1.0
            else:
                out[r][j] = struct.unpack(
                    "<f", struct.pack("<f", float(v.value if isinstance(v, Shrinker) else v))
                )[0]
    want_entries = [0] * (n * N_CAT)
    for f in range(N_CAT):
        for r in range(n):
            e = _lookup(key, code, salts, default, shift, keyed[f * n + r], f)
            want_entries[r * N_CAT + f] = e
            out[r][2 * N_NUM + f] = struct.unpack("<f", lift[e * 4 : e * 4 + 4])[0]
            out[r][int.from_bytes(column[e * 4 : e * 4 + 4], "little", signed=True)] += 1.0
    assert list(struct.unpack(f"<{n * N_CAT}i", entries)) == want_entries
    got = struct.unpack(f"<{n * width}f", features)
    want = [x for row in out for x in row]
    assert all(g == w or (g != g and w != w) for g, w in zip(got, want, strict=True))


def fuzz_rows(data: bytes) -> None:
    """A consistent table (entries, codes and columns in range) from the bytes, then rows() on it."""
    b = Bytes(data)
    built, width, raw, default, shift = _consistent_table(b)
    fuzz_rows_on(built, b, width, raw, default, shift)


def _consistent_table(b: Bytes) -> tuple[Any, int, list[bytes], int, int]:
    """A table whose entries, codes and columns are in range, from the bytes: (the table, its width, its raw
    parts [key, code, salts, lift, column], its default entry, its shift)."""
    from ctr_features.compiled._table_native import table

    shift, width = 60 + b.int() % 3, 53 + b.int(2) % 200
    slots, entries = 1 << (64 - shift), 1 + b.int() % 6
    key = b"".join(b.int(8).to_bytes(8, "little") if b.int() & 1 else bytes(8) for _ in range(slots))
    code = b"".join((b.int() % entries).to_bytes(4, "little") for _ in range(slots))
    salts, lift = b.take(N_CAT * 8), b.take(entries * 4)
    column = b"".join(
        (HASH_START + b.int(2) % (width - HASH_START)).to_bytes(4, "little") for _ in range(entries)
    )
    default = b.int() % entries
    built = table(key, code, salts, shift, default, lift, column, width)
    return built, width, [key, code, salts, lift, column], default, shift


def fuzz_differential(data: bytes) -> None:
    """Whatever the scan takes, the exact path decodes alike; whatever the exact path rejects, the scan declines."""
    import numpy as np

    from serving.codecs.rest_codec import decode_raw_body, parse_body, to_request
    from serving.errors import InvalidArgument
    from serving.signatures import Signature

    fast = decode_raw_body(data)
    try:
        exact = to_request(parse_body(data), Signature("features", "ctr", 128, 1, has_raw=True)).batch
    except InvalidArgument:
        assert fast is None, data[:200]
        return
    if fast is None:
        return
    columnar, batch = fast
    assert type(exact).__name__ == "RawBatch", (data[:200], exact)
    assert columnar == (b'"inputs"' in data)
    assert batch.numeric.dtype == exact.numeric.dtype == np.float64
    assert np.array_equal(np.isnan(batch.numeric), np.isnan(exact.numeric))
    present = ~np.isnan(exact.numeric)
    assert batch.numeric[present].tobytes() == exact.numeric[present].tobytes(), data[:200]
    key = batch.keys.key.copy()  # before the values are made from it
    values = exact.categorical.ravel().tolist()
    assert batch.categorical.tolist() == exact.categorical.tolist(), data[:200]
    assert key.ravel().tolist() == [key_of(v) for v in values]


def fuzz_cells(data: bytes) -> None:
    """cells() (a merged batch's categorical columns) on a table from the bytes, against the plain lookups;
    sizes that do not match the keys are refused."""
    from ctr_features.compiled._table_native import cells

    b = Bytes(data)
    built, width, (key, code, salts, lift, column), default, shift = _consistent_table(b)
    slots = len(key) // 8
    rows = real = 1 + b.int() % 6
    n = (0, -1, sys.maxsize // 208 + 1, rows + 1, rows, rows)[b.int() % 6]
    keyed = []
    for i in range(N_CAT * rows):  # row-major: row r's field f at r * N_CAT + f
        if b.int() % 2:
            keyed.append(b.int(8))
        else:  # a key the table holds for this field, so the lookup hits
            slot, f = b.int(2) % slots, i % N_CAT
            keyed.append(int.from_bytes(key[slot * 8 : slot * 8 + 8], "little") ^ _salt(salts, f))
    try:
        features, found = cells(built, _buffer(struct.pack(f"<{len(keyed)}Q", *keyed), b.int() % 8), n)
    except (ValueError, OverflowError) as exc:
        assert str(exc) in ERRORS and n != real, (str(exc), n)
        return
    assert n == real
    out = [[0.0] * width for _ in range(n)]
    want_entries = []
    for r in range(n):
        for f in range(N_CAT):
            e = _lookup(key, code, salts, default, shift, keyed[r * N_CAT + f], f)
            want_entries.append(e)
            out[r][2 * N_NUM + f] = struct.unpack("<f", lift[e * 4 : e * 4 + 4])[0]
            out[r][int.from_bytes(column[e * 4 : e * 4 + 4], "little", signed=True)] += 1.0
    assert list(struct.unpack(f"<{n * N_CAT}i", found)) == want_entries
    got = struct.unpack(f"<{n * width}f", features)
    want = [x for row in out for x in row]
    assert all(g == w or (g != g and w != w) for g, w in zip(got, want, strict=True))


def _salt(salts: bytes, field: int) -> int:
    return int.from_bytes(salts[field * 8 : field * 8 + 8], "little")


TARGETS = {
    "scan": fuzz_scan,
    "keys": fuzz_keys,
    "table": fuzz_table,
    "rows": fuzz_rows,
    "cells": fuzz_cells,
    "differential": fuzz_differential,
}
