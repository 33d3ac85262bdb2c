"""The exact path of raw REST rows (serving/codecs/raw_codec.py: every value form, every 400 message) and the
compiled FeatureSpec (ctr_features/compiled/table.py) against its one definition, `FeatureSpec.transform`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.few_rows import CACHED_COUNTS
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import DICT_ROWS, RawTransform
from ctr_features.compiled.table import fnv1a_32 as serving_fnv1a_32
from ctr_features.parity import build_raw_rows
from ctr_features.spec import FeatureSpec
from export.gates.parity import MIN_ROWS
from serving.codecs.raw_codec import MAX_COUNT, decode_rest
from serving.errors import InvalidArgument
from training.synth import sample_rows

# Every valid value form, one per row: plain ints, the bounds, missing as absent / null / "" / NaN, integral
# floats, numeric strings (the exact path's job), odd and non-ASCII categoricals.
VALID_ROWS: list[dict[str, Any]] = [
    {"I1": 1, "I2": -1, "I3": 0, "C1": "68fd1e64", "C2": ""},
    {"I1": MAX_COUNT - 1, "I2": -(MAX_COUNT - 1), "C3": None},
    {"I1": MAX_COUNT, "I13": -MAX_COUNT, "C26": "日本語"},
    {"I4": None, "I5": "", "I6": math.nan, "C4": "😀"},
    {"I7": 3.0, "I8": -2.0, "C5": " "},
    {"I9": "17", "I10": " -4 ", "C6": "a" * 300},
    {},
    {"I11": 1e6, "I12": 123456789, "C7": "C1:x", "C8": "\t"},
    {"I1": 2, "C1": "héllo"},
]


def same(a: RawBatch, b: RawBatch) -> bool:
    return (
        np.array_equal(a.numeric, b.numeric, equal_nan=True)
        and a.categorical.tolist() == b.categorical.tolist()
    )


def test_rows_decode_alike_in_one_batch_and_one_by_one() -> None:
    batch = decode_rest(VALID_ROWS, False)
    one_by_one = RawBatch.concat([decode_rest([row], False) for row in VALID_ROWS])
    assert same(batch, one_by_one)
    assert batch.numeric[0, 1] == MAX_COUNT - 1 and batch.numeric[0, 2] == MAX_COUNT


def test_columns_decode_exactly_as_the_rows() -> None:
    fields = NUMERIC_FIELDS + CATEGORICAL_FIELDS
    columns = {f: [r.get(f) for r in VALID_ROWS] for f in fields}
    assert same(decode_rest(columns, True), decode_rest(VALID_ROWS, False))


def _bad(value_field: str, value: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"I1": i, "C1": "x"} for i in range(12)]
    rows[9] = {"I1": 5, value_field: value}
    return rows


# Each 400 kind at instance 9 of 12 rows: the exact message, in row and in columnar format.
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "I14",
            1,
            'instance 9 has unknown field "I14"; raw fields are I1..I13 (counts) and C1..C26 (strings)',
        ),
        ("I2", 1.5, "instance 9 field 'I2' is 1.5, a fractional count; counts are integers"),
        ("I2", "1.5", "instance 9 field 'I2' is \"1.5\", a fractional count; counts are integers"),
        (
            "I2",
            "many",
            'instance 9 field \'I2\' is "many", not a count; send an integer, a numeric string, null or "" (missing)',
        ),
        (
            "I2",
            True,
            "instance 9 field 'I2' is true (bool), not a count; send an integer, a numeric string, null or \"\" (missing)",
        ),
        (
            "I2",
            MAX_COUNT + 1,
            f"instance 9 field 'I2' is {MAX_COUNT + 1}, out of range; counts must be within ±{MAX_COUNT} (2**53)",
        ),
        (
            "I2",
            10**400,
            "instance 9 field 'I2' is 1000000000000000000000000000000000000000, out of range; counts must be within ±9007199254740992 (2**53)",
        ),
        (
            "I2",
            math.inf,
            f"instance 9 field 'I2' is Infinity, out of range; counts must be within ±{MAX_COUNT} (2**53)",
        ),
        (
            "I2",
            [1],
            "instance 9 field 'I2' is [1] (list), not a count; send an integer, a numeric string, null or \"\" (missing)",
        ),
        ("C1", 5, "instance 9 field 'C1' is 5 (int), not a string; send a string, null or \"\" (missing)"),
        (
            "C1",
            False,
            "instance 9 field 'C1' is false (bool), not a string; send a string, null or \"\" (missing)",
        ),
    ],
    ids=[
        "unknown-field",
        "fractional",
        "fractional-string",
        "word",
        "boolean",
        "out-of-range",
        "huge-int",
        "infinity",
        "list",
        "category-not-a-string",
        "category-boolean",
    ],
)
def test_bad_values_in_large_batches_keep_the_exact_message(field: str, value: Any, message: str) -> None:
    rows = _bad(field, value)
    with pytest.raises(InvalidArgument) as caught:
        decode_rest(rows, False)
    assert caught.value.message == message
    if field != "I14":  # columnar: the same value at index 9 of a 12-value column
        with pytest.raises(InvalidArgument) as caught:
            decode_rest({field: [r.get(field) for r in rows]}, True)
        assert caught.value.message == message


def test_a_row_that_is_not_an_object_in_a_large_batch_is_named() -> None:
    rows: list[Any] = [{"I1": 1}] * 12
    rows[10] = [1, 2]
    with pytest.raises(InvalidArgument) as caught:
        decode_rest(rows, False)
    assert caught.value.message == (
        'instance 10 is [1, 2] (list), expected an object of raw Criteo fields such as {"I1": 3, "C1": "68fd1e64"}'
    )


def fit_spec() -> FeatureSpec:
    """A FeatureSpec fitted on 3,000 synthetic rows (C* values from 40 distinct ones)."""
    rng = np.random.default_rng(5)
    numeric, ranks = sample_rows(rng, 3_000)
    categorical = np.char.mod("%08x", ranks % 40).astype(object)
    categorical[ranks < 0] = ""
    labels = (rng.random(3_000) < 0.25 + 0.3 * (ranks[:, 8] == 0)).astype(np.float32)
    return FeatureSpec.fit(numeric, categorical, labels, min_count=20)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


def test_compiled_spec_equals_feature_spec_transform_bit_for_bit_on_every_gate_row_kind(
    spec: FeatureSpec,
) -> None:
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    assert set(groups) == {"vocabulary", "unseen", "all_missing", "extreme_counts", "odd_strings", "random"}
    expected = spec.transform(numeric, categorical)
    served = RawTransform(spec.to_dict())(RawBatch.from_rows(numeric, categorical))
    transform = RawTransform(spec.to_dict())
    for name, rows in groups.items():
        assert np.array_equal(served[rows], expected[rows]), name
        for n in (
            1,
            3,
            DICT_ROWS,
            DICT_ROWS + 1,
            200,
        ):  # dicts up to DICT_ROWS rows, the batch-wide table above
            few = slice(rows.start, rows.start + n)
            assert np.array_equal(
                transform(RawBatch.from_rows(numeric[few], categorical[few])), expected[few]
            )
    assert served.dtype == np.float32 and served.shape == (MIN_ROWS, spec.width)


def test_compiled_spec_of_decoded_rest_rows_equals_the_transform_of_the_same_rows(spec: FeatureSpec) -> None:
    known = spec.tables[0].vocab[0].decode()
    rows = [{"I1": 3, "I2": -1, "C1": known}, {"I1": MAX_COUNT, "C1": "never-seen"}, {}] * 4
    batch = decode_rest(rows, False)
    expected = spec.transform(batch.numeric.T, batch.categorical.T)
    assert np.array_equal(RawTransform(spec.to_dict())(batch), expected)
    assert expected[0, spec.oov_column] < expected[1, spec.oov_column]  # the known value is in vocabulary


def test_serving_bucket_hash_is_trainings_fnv1a() -> None:
    from ctr_features.hashing import fnv1a_32 as training_fnv1a_32

    for text in ["", "C1:68fd1e64", "C7:héllo", "C26:日本語", "C3:😀", "C9:" + "a" * 300, "C2:\t"]:
        assert serving_fnv1a_32(text) == training_fnv1a_32(text)


def test_a_lone_surrogate_is_named_in_rows_and_columns() -> None:
    rows: list[dict[str, Any]] = [{"C1": "ok"}] * 12
    rows[4] = {"C2": "\ud800"}  # not UTF-8 encodable: valid JSON, but no string a Criteo file holds
    for body, columnar in ((rows, False), ({"C2": [r.get("C2") for r in rows]}, True)):
        with pytest.raises(InvalidArgument) as caught:
            decode_rest(body, columnar)
        assert caught.value.message.startswith("instance 4 field 'C2' holds \\ud800 at character 0")


def test_one_row_transform_equals_feature_spec_transform_before_and_after_its_cache_fills(
    spec: FeatureSpec,
) -> None:
    (numeric, categorical), _ = build_raw_rows(spec, MIN_ROWS, None)
    expected = spec.transform(numeric, categorical)
    transform = RawTransform(spec.to_dict())
    one_row = transform._one_row
    assert one_row is not None  # the layout puts every bucket column after the lifts
    numpy_rows = []
    full = one_row._full
    one_row._full = lambda batch: numpy_rows.append(1) or full(batch)  # count the rows numpy transforms
    for attempt in ("first: counts from numpy", "second: from the cache where it had room"):
        numpy_rows.clear()
        for i in range(len(numeric)):
            row = RawBatch.from_rows(numeric[i : i + 1], categorical[i : i + 1])
            assert transform(row).tobytes() == expected[i : i + 1].tobytes(), (attempt, i)
        assert 0 < len(numpy_rows) < len(numeric), attempt  # both paths ran
    cached = one_row._z
    assert 0 < sum(map(len, cached)) <= CACHED_COUNTS * len(NUMERIC_FIELDS)
    assert not any(math.isinf(v) or math.isnan(v) for c in cached for v in c)  # only present counts
