"""serving/codecs/raw_codec.py without a server: raw Criteo rows (REST and gRPC) -> RawBatch, exact messages."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from serving import protos
from serving.codecs.raw_codec import MAX_COUNT, decode_rest, decode_tensors, looks_raw
from serving.errors import InvalidArgument


def error_of(rows: Any, columnar: bool = False) -> str:
    with pytest.raises(InvalidArgument) as caught:
        decode_rest(rows, columnar)
    return caught.value.message


def test_every_missing_form_is_nan_or_empty_and_counts_become_float64() -> None:
    batch = decode_rest(
        [{"I1": 3, "I2": "7", "I3": 4.0, "I4": None, "I5": "", "C1": "68fd1e64", "C2": None}], False
    )
    assert batch.numeric.shape == (len(NUMERIC_FIELDS), 1) and batch.numeric.dtype == np.float64
    assert batch.numeric[:3, 0].tolist() == [3.0, 7.0, 4.0]
    assert all(math.isnan(v) for v in batch.numeric[3:, 0])
    assert batch.categorical[:, 0].tolist() == ["68fd1e64"] + [""] * (len(CATEGORICAL_FIELDS) - 1)


def test_columnar_inputs_match_the_row_format() -> None:
    rows = decode_rest([{"I1": 1, "C3": "a"}, {"I1": 2}], False)
    columns = decode_rest({"I1": [1, 2], "C3": ["a", None]}, True)
    assert np.array_equal(rows.numeric, columns.numeric, equal_nan=True)
    assert rows.categorical.tolist() == columns.categorical.tolist()


def test_no_rows_is_an_empty_batch_of_the_right_shape_for_validation_to_name() -> None:
    for batch in (decode_rest([], False), decode_rest({}, True), decode_rest({"I1": []}, True)):
        assert len(batch) == 0
        assert batch.numeric.shape == (len(NUMERIC_FIELDS), 0)
        assert batch.categorical.shape == (len(CATEGORICAL_FIELDS), 0)


def test_concat_joins_batches_row_after_row() -> None:
    joined = RawBatch.concat([decode_rest([{"I1": 1}], False), decode_rest([{"I1": 2}, {"I1": 3}], False)])
    assert joined.inputs["I1"].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("rows", "columnar", "message"),
    [
        ({"I1": 3}, False, "'instances' must be a list of objects of raw Criteo fields, got dict"),
        (
            [3],
            False,
            'instance 0 is 3 (int), expected an object of raw Criteo fields such as {"I1": 3, "C1": "68fd1e64"}',
        ),
        (
            [{"I14": 1}],
            False,
            'instance 0 has unknown field "I14"; raw fields are I1..I13 (counts) and C1..C26 (strings)',
        ),
        ([{}, {"I2": 1.5}], False, "instance 1 field 'I2' is 1.5, a fractional count; counts are integers"),
        ([{"I2": "1.5"}], False, "instance 0 field 'I2' is \"1.5\", a fractional count; counts are integers"),
        (
            [{"I2": "many"}],
            False,
            'instance 0 field \'I2\' is "many", not a count; send an integer, a numeric string, null or "" (missing)',
        ),
        (
            [{"I2": True}],
            False,
            "instance 0 field 'I2' is true (bool), not a count; send an integer, a numeric string, null or \"\" (missing)",
        ),
        (
            [{"I2": MAX_COUNT + 1}],
            False,
            f"instance 0 field 'I2' is {MAX_COUNT + 1}, out of range; counts must be within ±{MAX_COUNT} (2**53)",
        ),
        (
            [{"C1": 5}],
            False,
            "instance 0 field 'C1' is 5 (int), not a string; send a string, null or \"\" (missing)",
        ),
        ([3], True, "'inputs' must be an object of raw Criteo fields, got list"),
        (
            {"X": [1]},
            True,
            "'inputs' has unknown field \"X\"; raw fields are I1..I13 (counts) and C1..C26 (strings)",
        ),
        ({"I1": 1}, True, "'inputs' field 'I1' is 1 (int), expected a list with one value per instance"),
        (
            {"I1": [1, 2], "C1": ["a"]},
            True,
            "'inputs' fields have different lengths {'I1': 2, 'C1': 1}; send one value per instance",
        ),
    ],
    ids=[
        "rows-not-a-list",
        "row-not-an-object",
        "unknown-field",
        "fractional",
        "fractional-string",
        "word",
        "boolean",
        "out-of-range",
        "category-not-a-string",
        "columns-not-an-object",
        "unknown-column",
        "column-not-a-list",
        "ragged-columns",
    ],
)
def test_bad_raw_rows_name_the_instance_the_field_and_the_fix(
    rows: Any, columnar: bool, message: str
) -> None:
    assert error_of(rows, columnar) == message


def test_looks_raw_only_for_raw_field_names_or_an_empty_row() -> None:
    assert looks_raw([{"I1": 1}], False, "features")
    assert looks_raw([{}], False, "features")
    assert looks_raw({"C1": ["a"]}, True, "features")
    assert not looks_raw([{"features": [0.5]}], False, "features")
    assert not looks_raw([[0.5]], False, "features")
    assert not looks_raw([], False, "features")


def _tensors(**columns: Any) -> Any:
    request = protos.PredictRequest()  # the server's own descriptors: no TensorFlow import
    for key, (dtype, values) in columns.items():
        tensor = request.inputs[key]
        tensor.dtype = dtype
        tensor.tensor_shape.dim.add().size = len(values)
        if dtype == 7:  # DT_STRING
            tensor.string_val.extend(values)
        elif dtype == 2:  # DT_DOUBLE
            tensor.double_val.extend(values)
        else:  # DT_INT64
            tensor.int64_val.extend(values)
    return request.inputs


def test_grpc_tensors_decode_doubles_integers_and_strings() -> None:
    batch = decode_tensors(_tensors(I1=(2, [3.0, math.nan]), I2=(9, [4, 5]), C1=(7, [b"68fd1e64", b""])))
    assert batch.inputs["I1"][0] == 3.0 and math.isnan(batch.inputs["I1"][1])
    assert batch.inputs["I2"].tolist() == [4.0, 5.0]
    assert batch.inputs["C1"].tolist() == ["68fd1e64", ""]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            {"X": (7, [b"a"])},
            'inputs has unknown field "X"; raw fields are I1..I13 (counts) and C1..C26 (strings)',
        ),
        ({"C1": (2, [1.0])}, "input 'C1' has dtype DT_DOUBLE, expected DT_STRING"),
        ({"I1": (2, [1.5])}, "row 0 field 'I1' is 1.5, a fractional count; counts are integers"),
        (
            {"I1": (2, [1.0]), "C1": (7, [b"a", b"b"])},
            "raw inputs have different lengths {'I1': 1, 'C1': 2}; send one value per row in each",
        ),
        ({"C1": (7, [b"\xff"])}, "row 0 field 'C1' is b'\\xff', not UTF-8 text; send UTF-8 strings"),
    ],
    ids=["unknown-field", "category-as-double", "fractional", "ragged", "not-utf8"],
)
def test_bad_grpc_raw_tensors_name_the_input(columns: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode_tensors(_tensors(**columns))
    assert caught.value.message == message
