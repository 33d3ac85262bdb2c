"""The batch-wide (field, value) lookup gives exactly the dicts' answers, whatever the strings hold."""

from __future__ import annotations

import numpy as np
import pytest

from ctr_features.compiled import value_table
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.value_table import RawKeys, ValueTable

TABLES = [
    {"68fd1e64": 1, "": 2, "ab": 3, "abcdefgh": 4, "abcdefghi": 5, "héllo!!": 6, "日本ab": 7, "\1" * 8: 8},
    {"68fd1e64": 9, "x": 10, "a\0b": 11, "ABCDEFGH": 12},
    {},
]
# Values of 8 bytes or none, which a batch keys: ASCII ones are found in the table, others ("héllo!!" and
# "日本ab" are 8 UTF-8 bytes) in the dicts.
KEYED = ["68fd1e64", "", "abcdefgh", "ABCDEFGH", "héllo!!", "日本ab", "never-se", "68fd1e65"]


def by_dict(values: np.ndarray, default: int) -> np.ndarray:
    return np.array([[TABLES[f].get(v, default) for v in row] for f, row in enumerate(values.tolist())])


def batch(rows: list[list[str]]) -> np.ndarray:
    """(3, N) object array of the rows' values, each row giving one value per field."""
    return np.array(rows, dtype=object).T.copy()


@pytest.mark.parametrize("default", [0, -1])
def test_every_value_pair_of_every_field_is_looked_up_as_the_dicts_do(default: int) -> None:
    table = ValueTable(TABLES, default)
    values = batch([[a, b, a] for a in KEYED for b in KEYED])
    keys = RawKeys.of(values)
    assert keys is not None and keys.slow is not None  # keyed, the non-ASCII values left to the dicts
    assert np.array_equal(table.lookup(values, keys), by_dict(values, default))
    assert np.array_equal(table.lookup(values, None), by_dict(values, default))


@pytest.mark.parametrize(
    ("rows", "keyed"),
    [
        ([["68fd1e64", "68fd1e64", "abcdefgh"]] * 5, True),  # every value 8 bytes
        ([["68fd1e64", "", "x" * 8], ["", "", ""], ["abcdefgh", "", ""]], True),  # and missing ones
        ([["", "", ""]] * 3, True),  # all missing
        ([["héllo!!", "日本ab", "68fd1e64"]] * 3, True),  # non-ASCII: by dict, value by value
        ([["ab", "x", "68fd1e64"]] * 2, True),  # shorter than 8 bytes: keyed in C (the numpy join: by dict)
        ([["abcdefghi", "x", "ab"]] * 2, False),  # longer
        ([["a\0b", "x", ""]], False),  # a NUL
        ([["\1" * 8, "", "x"]], False),  # 0x01, the byte that spells "" in a key
        ([["\ud800", "x", ""]], False),  # a lone surrogate
    ],
)
def test_each_kind_of_batch_gets_the_dicts_answers(rows: list[list[str]], keyed: bool) -> None:
    values = batch(rows)
    keys = RawKeys.of(values)
    assert (keys is not None) == keyed
    assert np.array_equal(ValueTable(TABLES, 0).lookup(values, keys), by_dict(values, 0))


def test_without_the_extension_short_values_go_by_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(value_table, "_native_keys", None)
    values = batch([["ab", "x", "68fd1e64"]] * 2)
    assert RawKeys.of(values) is None
    keys = RawKeys.of(batch([["68fd1e64", "", "x" * 8]] * 2))
    assert keys is not None and keys.slow is None


def test_merged_batches_carry_their_parts_keys_without_recomputing_them() -> None:
    a, b = batch([["68fd1e64", "", "x" * 8]] * 2), batch([["héllo!!", "abcdefgh", ""]] * 3)
    parts = [RawBatch(np.zeros((13, 2)), a), RawBatch(np.zeros((13, 3)), b)]
    assert all(p.keys is not None for p in parts)
    merged = RawBatch.concat(parts)
    assert merged.keys_known  # joined, not computed
    fresh = RawKeys.of(merged.categorical)
    assert fresh is not None and merged.keys is not None
    assert np.array_equal(merged.keys.key, fresh.key)
    assert merged.keys.slow is not None and fresh.slow is not None
    assert np.array_equal(merged.keys.slow, fresh.slow)
    table = ValueTable(TABLES, 0)
    assert np.array_equal(table.lookup(merged.categorical, merged.keys), by_dict(merged.categorical, 0))


def test_a_table_too_crowded_for_its_slots_grows_until_every_entry_has_one() -> None:
    tables = [{f"{i:08x}": i + 1 for i in range(f, 3000, 7)} for f in range(7)]
    table = ValueTable(tables, 0)
    values = np.array([[f"{i:08x}" for i in range(3000)]] * 7, dtype=object)
    expected = np.array([[t.get(v, 0) for v in row] for t, row in zip(tables, values.tolist(), strict=True)])
    assert np.array_equal(table.lookup(values, RawKeys.of(values)), expected)


def test_scanned_rest_rows_arrive_with_the_keys_of_their_categoricals() -> None:
    import orjson

    from serving.codecs.rest_codec import decode_raw_body

    rows = [{"I1": i, "C1": "68fd1e64", "C2": None, "C26": "abcdefgh"} for i in range(12)] + [{}]
    found = decode_raw_body(orjson.dumps({"instances": rows}))
    assert found is not None
    decoded = found[1]
    assert decoded.keys_known and not decoded.holds_array  # set by the scan, not computed by the property
    fresh = RawKeys.of(decoded.categorical)
    assert decoded.keys is not None and fresh is not None
    assert np.array_equal(decoded.keys.key, fresh.key) and decoded.keys.slow is fresh.slow is None
    assert decoded.categorical[1, 0] == "" and decoded.categorical[2, 5] == ""  # null and absent: missing
