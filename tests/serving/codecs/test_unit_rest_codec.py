"""serving/codecs/rest_codec.py without a server: a REST predict body -> DecodedRequest, and scores -> JSON."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from ctr_contract.signatures import DEFAULT_WIDTH
from ctr_features.compiled.raw_batch import RawBatch
from serving.codecs.rest_codec import encode_predictions, parse_body, to_request
from serving.errors import InvalidArgument
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature

WIDTH = DEFAULT_WIDTH
FEATURES = Signature("features", "ctr", WIDTH, 1)
WITH_RAW = Signature("features", "ctr", WIDTH, 1, has_raw=True)
ROW = [0.5] * WIDTH


def decode(body: Any, sig: Signature = FEATURES) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return to_request(parse_body(raw), sig)


def error_of(body: Any, sig: Signature = FEATURES) -> str:
    with pytest.raises(InvalidArgument) as caught:
        decode(body, sig)
    return caught.value.message


def test_row_format_decodes_to_float32_features_of_serving_default() -> None:
    request = decode({"instances": [ROW, [1] * WIDTH]})
    assert request.signature == DEFAULT_SIGNATURE
    assert request.batch.dtype == np.float32 and request.batch.shape == (2, WIDTH)
    assert request.batch[1].tolist() == [1.0] * WIDTH


def test_columnar_and_named_instances_decode_to_the_same_batch() -> None:
    columnar = parse_body(json.dumps({"inputs": {"features": [ROW]}}).encode())
    assert columnar.columnar
    named = decode({"instances": [{"features": ROW}]})
    assert to_request(columnar, FEATURES).batch.tolist() == named.batch.tolist() == [ROW]


def test_empty_instances_leave_an_empty_batch_for_validation_to_name() -> None:
    request = decode({"instances": []})
    assert (request.signature, request.batch.shape) == (DEFAULT_SIGNATURE, (0, WIDTH))


def test_raw_field_names_pick_the_raw_signature_without_signature_name() -> None:
    request = decode({"instances": [{"I1": 3, "C1": "68fd1e64"}, {}]}, WITH_RAW)
    assert request.signature == RAW_SIGNATURE
    assert isinstance(request.batch, RawBatch) and len(request.batch) == 2
    assert request.batch.inputs["I1"].tolist()[0] == 3.0 and request.batch.inputs["C1"].tolist() == [
        "68fd1e64",
        "",
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"{",
            "malformed JSON body: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (b"[1]", "the body must be a JSON object, got list"),
        (
            {"instances": [ROW], "inputs": [ROW]},
            "the body has both 'instances' and 'inputs'; send one (row or columnar format)",
        ),
        (
            {"rows": [ROW]},
            "the body is missing 'instances' (row format) or 'inputs' (columnar format); keys: ['rows']",
        ),
        (
            {"signature_name": "classify", "instances": [ROW]},
            'Serving signature name: "classify" not found in signature def',
        ),
        ({"instances": 3}, f"'instances' must be a list of {WIDTH}-number lists, got int"),
        ({"inputs": {"feats": [ROW]}}, "'inputs' has keys ['feats'], expected exactly ['features']"),
        ({"instances": [ROW[:-1]]}, f"expected {WIDTH} features per instance, got {WIDTH - 1} in instance 0"),
        ({"instances": [ROW, ["x", *ROW[1:]]]}, 'instance 1 feature 0 is "x" (str), expected a number'),
        ({"instances": [[True, *ROW[1:]]]}, "instance 0 feature 0 is true (bool), expected a number"),
        ({"instances": [0.5]}, f"instance 0 is 0.5 (float), expected a list of {WIDTH} numbers"),
        (
            {"instances": [{"feats": ROW}]},
            "instance 0 must be an object with exactly the key 'features', got ['feats']",
        ),
    ],
    ids=[
        "truncated-json",
        "not-an-object",
        "both-formats",
        "no-rows",
        "unknown-signature",
        "not-a-list",
        "wrong-input-name",
        "short-row",
        "string-value",
        "boolean-value",
        "flat-list",
        "wrong-named-key",
    ],
)
def test_bad_bodies_name_the_value_and_the_fix(body: Any, message: str) -> None:
    assert error_of(body) == message


def test_raw_rows_for_a_version_without_the_raw_graph_name_the_fix() -> None:
    assert error_of({"signature_name": "raw", "instances": [{}]}) == (
        'Serving signature name: "raw" not found in signature def; this version was exported before raw '
        "serving: send 'features' or re-export it"
    )


def test_nan_literal_is_parsed_so_validation_can_name_it() -> None:
    body = ('{"instances": [[NaN' + ", 0.5" * (WIDTH - 1) + "]]}").encode()
    assert np.isnan(decode(body).batch[0, 0])


def test_predictions_and_outputs_are_written_with_float32_shortest_repr() -> None:
    scores = np.array([[0.5494658], [0.25]], np.float32)
    assert encode_predictions(scores, columnar=False) == b'{"predictions":[[0.5494658],[0.25]]}'
    assert encode_predictions(scores, columnar=True) == b'{"outputs":[[0.5494658],[0.25]]}'
