"""The native code's own checks, one test per finding of the sanitizer fuzzing (docs/raw-features.md, Fuzzing):
an empty column copies nothing, every size is checked for overflow (an OverflowError), `table()` bounds its
width, `rows()` reads `z` from its own copy while an item's `__float__` runs, and buffers at any alignment
read the same values; `cells()` is checked as `rows()` is. The fuzz targets (fuzz/targets.py) run the same calls under ASan and UBSan."""

from __future__ import annotations

import re
import sys
from typing import Any

import numpy as np
import pytest

from ctr_features.compiled import few_rows
from serving.codecs import raw_body

pytestmark = pytest.mark.skipif(
    few_rows._native_table is None or raw_body.scan is None, reason="the native extensions are not built"
)
WIDTH = 128


def table_args(width: int = WIDTH) -> list[Any]:
    key, code, salts = np.zeros(16, np.uint64), np.zeros(16, np.int32), np.zeros(26, np.uint64)
    lift, column = np.full(2, 0.25, np.float32), np.full(2, 100, np.int32)
    return [key.tobytes(), code.tobytes(), salts.tobytes(), 60, 0, lift.tobytes(), column.tobytes(), width]


def table(width: int = WIDTH) -> Any:
    assert few_rows._native_table is not None
    return few_rows._native_table(*table_args(width))


def rows(*args: Any) -> Any:
    assert few_rows._native_rows is not None
    return few_rows._native_rows(*args)


def test_an_empty_column_copies_nothing_and_is_declined() -> None:
    """Finding 1: `{"inputs":{"I1":[]}}` called memcpy(dst, NULL, 0); now no copy, and the exact path's body."""
    assert raw_body.scan is not None
    for body in (b'{"inputs":{"I1":[]}}', b'{"inputs":{"I1":[],"C1":[]}}', b'{"inputs":{"C26":[]}}'):
        assert raw_body.scan(body, 1, raw_body.MAX_SCAN_ROWS) is None
        assert raw_body.scan(body, 0, raw_body.MAX_SCAN_ROWS) is None  # no rows: never taken


@pytest.mark.parametrize(
    ("n", "message"),
    [
        (sys.maxsize // 13 + 1, "n is too large"),  # 13 * n wrapped before
        (sys.maxsize // 104 + 1, "n is too large"),
        (sys.maxsize // 208 + 1, "n is too large"),
        (sys.maxsize // (WIDTH * 4) + 1, "n * width is too large"),
    ],
)
def test_rows_with_a_huge_n_raise_overflow_instead_of_wrapping(n: int, message: str) -> None:
    """Finding 2: the length checks multiplied n by 13, 104 and 208 in signed arithmetic."""
    counts, keys = np.zeros((13, 2)), np.zeros((26, 2), np.uint64)
    with pytest.raises(OverflowError, match=f"^{re.escape(message)}$"):
        rows(table(), [0.0] * 26, counts, keys, n)


def test_rows_of_a_wide_table_raise_overflow_for_n_times_width() -> None:
    """Finding 3 (rows' side): n * width * 4 is checked; the widest table and an n that overflows with it."""
    wide = table(1 << 20)
    n = sys.maxsize // ((1 << 20) * 4) + 1
    with pytest.raises(OverflowError, match=r"^n \* width is too large$"):
        rows(wide, [0.0] * 26, np.zeros((13, 2)), np.zeros((26, 2), np.uint64), n)


@pytest.mark.parametrize("width", [0, 52, (1 << 20) + 1, sys.maxsize, -1])
def test_table_bounds_its_width(width: int) -> None:
    """Finding 3: `table()` checked only 52 <= column < width, so any huge width passed."""
    assert few_rows._native_table is not None
    args = table_args(width)
    args[6] = np.full(2, 52, np.int32).tobytes()  # a column every width above 52 would hold
    with pytest.raises(ValueError, match=r"^the width must be from 53 to 1048576$"):
        few_rows._native_table(*args)
    for width in (53, 1 << 20):
        args[7] = width
        assert few_rows._native_table(*args) is not None


class Shrinking:
    """A z-score whose __float__ empties the list it sits in: borrowed items would be freed under rows()."""

    def __init__(self, z: list[Any]) -> None:
        self.z = z

    def __float__(self) -> float:
        self.z.clear()
        return 0.5


def test_rows_hold_z_while_an_items_float_clears_the_list() -> None:
    """Finding 4: rows() kept borrowed items of `z` while __float__ ran; now it reads a tuple copy."""
    z: list[Any] = [0.25] * 26
    z[0] = Shrinking(z)
    z[1:26] = [float(i) + 0.125 for i in range(1, 26)]
    features, _ = rows(table(), z, np.zeros((13, 2)), np.zeros((26, 2), np.uint64), 2)
    assert z == []  # cleared, as it asked
    out = np.frombuffer(features, np.float32).reshape(2, WIDTH)
    want = np.array([0.5, *[i + 0.125 for i in range(1, 26)]], np.float32).reshape(13, 2).T
    assert out[:, :13].tolist() == want.tolist()
    with pytest.raises(TypeError, match=r"must be real number, not str"):
        rows(table(), ["x"] * 26, np.zeros((13, 2)), np.zeros((26, 2), np.uint64), 2)


def misaligned(data: bytes) -> memoryview:
    """`data` one byte off any alignment: `y*` takes it (a contiguous buffer)."""
    return memoryview(b"\0" + data)[1:]


def test_buffers_at_any_alignment_read_the_same_values() -> None:
    """Finding 5: typed loads from a misaligned buffer; now every load is a memcpy, with the same result."""
    assert few_rows._native_table is not None
    salts = np.arange(26, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    key, code = np.zeros(16, np.uint64), np.zeros(16, np.int32)
    salted = int(np.uint64(7) ^ salts[0])
    first = (salted * 0x9E3779B97F4A7C15 % 2**64) >> 60  # its first slot (value_table.py's hashing)
    key[first], code[first] = salted, 1
    lift, column = np.array([0.25, 0.75], np.float32), np.array([100, 60], np.int32)
    parts = [key.tobytes(), code.tobytes(), salts.tobytes(), 60, 0, lift.tobytes(), column.tobytes(), WIDTH]
    odd = [misaligned(p) if isinstance(p, bytes) else p for p in parts]
    counts = np.full((13, 3), np.nan)
    keys = np.full((26, 3), 7, np.uint64)
    z: list[Any] = [None] * 39
    aligned = rows(few_rows._native_table(*parts), z, counts.tobytes(), keys.tobytes(), 3)
    shifted = rows(
        few_rows._native_table(*odd), z, misaligned(counts.tobytes()), misaligned(keys.tobytes()), 3
    )
    assert aligned is not None and shifted is not None
    assert bytes(aligned[0]) == bytes(shifted[0]) and bytes(aligned[1]) == bytes(shifted[1])
    out = np.frombuffer(shifted[0], np.float32).reshape(3, WIDTH)
    assert out[:, 13:26].tolist() == [[1.0] * 13] * 3  # every count missing
    assert (
        out[:, 26].tolist() == [0.75] * 3
    )  # C1's key 7 is in the table (entry 1); the others miss (entry 0)
    assert out[:, 60].tolist() == [1.0] * 3 and out[:, 100].tolist() == [25.0] * 3


def test_cells_check_their_sizes_and_read_keys_row_major() -> None:
    """`cells()`, the categorical part of a larger batch: its sizes checked as `rows()`' are, its keys row-major
    (n, 26) at any alignment, and the same lookups, lifts and bucket counts as `rows()` (every other column 0)."""
    cells = few_rows._native_cells
    assert cells is not None
    keys = np.zeros((2, 26), np.uint64)
    for n in (0, 3):
        with pytest.raises(ValueError, match="26 values per row"):
            cells(table(), keys, n)
    with pytest.raises(OverflowError, match=r"^n is too large$"):
        cells(table(), keys, sys.maxsize // 208 + 1)
    with pytest.raises(OverflowError, match=r"^n \* width is too large$"):
        cells(table(1 << 20), keys, sys.maxsize // ((1 << 20) * 4) + 1)
    with pytest.raises(ValueError, match="invalid PyCapsule"):
        cells(b"not a table", keys, 2)
    features, entries = cells(table(), misaligned(keys.tobytes()), 2)
    out = np.frombuffer(features, np.float32).reshape(2, WIDTH)
    assert out[:, 26:52].tolist() == [[0.25] * 26] * 2 and out[:, 100].tolist() == [26.0] * 2
    assert not out[:, :26].any() and not out[:, 52:100].any() and not out[:, 101:].any()
    assert np.frombuffer(entries, np.int32).tolist() == [0] * 52
    z: list[Any] = [0.0] * 26
    want = rows(table(), z, np.zeros((13, 2)), np.ascontiguousarray(keys.T), 2)
    assert bytes(entries) == bytes(want[1])
    assert np.array_equal(out[:, 26:], np.frombuffer(want[0], np.float32).reshape(2, WIDTH)[:, 26:])
