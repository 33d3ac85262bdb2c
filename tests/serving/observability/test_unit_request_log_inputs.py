"""A raw request's `inputs` in its log line (DecodedRequest.logged_inputs): the 39 columns of RawBatch.inputs,
in its order, as JSON the same whichever form the decoder left the batch in (the scan's keys, the values' list,
the arrays), rows and columns, missing counts null and missing values ""."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from serving.app.curl_example import CRITEO_ROW
from serving.codecs import raw_body
from serving.codecs.rest_codec import decode_raw_body
from serving.requests import DecodedRequest
from serving.signatures import RAW_SIGNATURE

SPARSE = {"I1": 7, "I12": 0, "C1": "68fd1e64", "C26": "", "C9": "a7cf409e"}  # the rest missing


def line_inputs(batch: RawBatch) -> bytes:
    """The `inputs` of a log line as the writer serializes them."""
    return orjson.dumps(
        DecodedRequest(RAW_SIGNATURE, batch).logged_inputs(), option=orjson.OPT_SERIALIZE_NUMPY
    )


def expected(batch: RawBatch) -> bytes:
    """RawBatch.inputs, every column a list."""
    return orjson.dumps({"inputs": {k: v.tolist() for k, v in batch.inputs.items()}})


def decoded(body: dict[str, Any]) -> RawBatch:
    found = decode_raw_body(orjson.dumps(body))
    assert found is not None
    return found[1]


def test_columns_of_arrays_are_the_batch_inputs_in_order() -> None:
    numeric = np.array([[1.0, np.nan], *[[float(i), 2.0] for i in range(12)]])
    categorical = np.array([[f"v{i}", ""] for i in range(26)], dtype=object)
    batch = RawBatch(numeric, categorical)
    assert line_inputs(batch) == expected(batch)
    columns = orjson.loads(line_inputs(batch))["inputs"]
    assert list(columns) == [*NUMERIC_FIELDS, *CATEGORICAL_FIELDS]
    assert columns["I1"] == [1.0, None] and columns["C1"] == ["v0", ""] and columns["C26"] == ["v25", ""]


@pytest.mark.skipif(raw_body.scan is None, reason="the native scan is not built")
@pytest.mark.parametrize(
    "body",
    [
        {"instances": [CRITEO_ROW]},
        {"instances": [CRITEO_ROW, SPARSE, CRITEO_ROW]},
        {"inputs": {k: [v, v] for k, v in CRITEO_ROW.items()}},
    ],
)
def test_columns_of_decoded_requests_are_the_batch_inputs(body: dict[str, Any]) -> None:
    assert line_inputs(decoded(body)) == expected(decoded(body))
