"""A raw request's `inputs` in its log line (DecodedRequest.logged_inputs): the 39 columns of RawBatch.inputs,
in its order, as JSON the same whichever form the decoder left the batch in (the scan's keys, the values' list,
the arrays), rows and columns, missing counts null and missing values "". Inputs that cannot be made or written
cost their line alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from serving.app.curl_example import CRITEO_ROW
from serving.codecs import raw_body
from serving.codecs.rest_codec import decode_raw_body
from serving.observability.request_log import RequestLog
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


def test_a_line_whose_inputs_cannot_be_made_or_written_is_dropped_and_counted(tmp_path: Path) -> None:
    """inputs() runs on the writer's thread: a failure there costs its line, counted, never the writer."""
    dropped: list[int] = []
    outputs = np.zeros((1, 1), np.float32)

    def unmakeable() -> Any:
        raise ValueError("some values are not keyed")

    async def scenario() -> None:
        log = RequestLog(tmp_path, 1.0, 1 << 20, on_drop=dropped.append)
        log.start()
        log.record("bad-1", "ctr", 1, lambda: {"instances": object()}, outputs)
        log.record("bad-2", "ctr", 1, unmakeable, outputs)
        log.record("good", "ctr", 1, lambda: {"instances": [[1.0]]}, outputs)
        await asyncio.to_thread(log.stop)
        await asyncio.sleep(0)  # the drop counts come back to this loop

    asyncio.run(scenario())
    lines = [
        orjson.loads(line) for f in tmp_path.glob("requests-*.jsonl") for line in f.read_bytes().splitlines()
    ]
    assert [line["request_id"] for line in lines] == ["good"] and lines[0]["inputs"] == {"instances": [[1.0]]}
    assert dropped == [1, 1]
