"""Every bad input is a 400 (413 for size) with a message naming the instance; the server keeps serving."""

from __future__ import annotations

import json

import pytest

from tests.serving.server_process import ServerProcess, http

ROW = [0.25] * 128
NONFINITE_HINT = "NaN and Inf are rejected (start the server with --allow_nonfinite to accept them)"


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


BAD_BODIES = [
    pytest.param(
        b'{"instances": [[0.1, ',
        "malformed JSON body: Expecting value: line 1 column 22 (char 21)",
        id="malformed-json",
    ),
    pytest.param(b"[1, 2]", "the body must be a JSON object, got list", id="not-an-object"),
    pytest.param(
        b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        "malformed JSON body: nested too deeply",
        id="nested-too-deeply",
    ),
    pytest.param(
        b'{"instances": [[' + b"[" * 1000 + b"]" * 1000 + b"," + b"0.5," * 126 + b"0.5]]}",
        "instance 0 feature 0 is a deeply nested list (list), expected a number",
        id="deeply-nested-feature",
    ),
    pytest.param(
        _body({"rows": [ROW]}),
        "the body is missing 'instances' (row format) or 'inputs' (columnar format); keys: ['rows']",
        id="missing-key",
    ),
    pytest.param(
        _body({"instances": [ROW], "inputs": [ROW]}),
        "the body has both 'instances' and 'inputs'; send one (row or columnar format)",
        id="both-keys",
    ),
    pytest.param(
        _body({"instances": [ROW, ROW[:127]]}),
        "expected 128 features per instance, got 127 in instance 1",
        id="127-features",
    ),
    pytest.param(
        _body({"instances": [[*ROW, 1.0]]}),
        "expected 128 features per instance, got 129 in instance 0",
        id="129-features",
    ),
    pytest.param(
        _body({"instances": [ROW, [*ROW[:5], "abc", *ROW[6:]]]}),
        'instance 1 feature 5 is "abc" (str), expected a number',
        id="string-value",
    ),
    pytest.param(
        _body({"instances": [[None, *ROW[1:]]]}),
        "instance 0 feature 0 is null (NoneType), expected a number",
        id="null-value",
    ),
    pytest.param(
        _body({"instances": [0.5, 0.5]}),
        "instance 0 is 0.5 (float), expected a list of 128 numbers",
        id="flat-list",
    ),
    pytest.param(
        ('{"instances": [[' + ", ".join(["0.5"] * 7 + ["NaN"] + ["0.5"] * 120) + "]]}").encode(),
        f"instance 0 feature 7 is nan (not finite in float32); {NONFINITE_HINT}",
        id="nan",
    ),
    pytest.param(
        (
            '{"instances": [' + json.dumps(ROW) + ", [" + ", ".join(["-Infinity"] + ["0.5"] * 127) + "]]}"
        ).encode(),
        f"instance 1 feature 0 is -inf (not finite in float32); {NONFINITE_HINT}",
        id="minus-infinity",
    ),
    pytest.param(
        _body({"instances": [[1e39, *ROW[1:]]]}),
        f"instance 0 feature 0 is inf (not finite in float32); {NONFINITE_HINT}",
        id="float32-overflow",
    ),
    pytest.param(
        _body({"instances": []}),
        "empty batch: no instances for input 'features'; send at least one",
        id="empty-batch",
    ),
    pytest.param(
        _body({"inputs": {"features": []}}),
        "empty batch: no instances for input 'features'; send at least one",
        id="empty-columnar",
    ),
    pytest.param(
        _body({"instances": [ROW] * 1025}),
        "batch of 1025 instances is over the limit of 1024 (--max_instances); split it",
        id="over-max-instances",
    ),
    pytest.param(
        _body({"inputs": {"feats": [ROW]}}),
        "'inputs' has keys ['feats'], expected exactly ['features']",
        id="wrong-input-name",
    ),
    pytest.param(
        _body({"instances": 3}),
        "'instances' must be a list of 128-number lists, got int",
        id="instances-not-a-list",
    ),
    pytest.param(
        _body({"signature_name": "classify", "instances": [ROW]}),
        'Serving signature name: "classify" not found in signature def',
        id="unknown-signature",
    ),
]


@pytest.mark.parametrize(("raw", "error"), BAD_BODIES)
def test_predict_rejects_bad_input_with_400(shared_server: ServerProcess, raw: bytes, error: str) -> None:
    assert http(shared_server.url("/v1/models/ctr:predict"), raw=raw) == (400, {"error": error})


def test_body_over_size_limit_is_413(shared_server: ServerProcess) -> None:
    raw = _body({"instances": [ROW]}) + b" " * (8 << 20)
    assert http(shared_server.url("/v1/models/ctr:predict"), raw=raw) == (
        413,
        {"error": f"request body of {len(raw)} bytes is over the limit of {8 << 20} (--max_body_bytes)"},
    )


def test_server_keeps_serving_after_bad_inputs(shared_server: ServerProcess) -> None:
    for param in BAD_BODIES:
        raw = param.values[0]
        assert isinstance(raw, bytes)
        http(shared_server.url("/v1/models/ctr:predict"), raw=raw)
    status, body = http(shared_server.url("/v1/models/ctr:predict"), {"instances": [ROW]})
    assert status == 200
    assert len(body["predictions"]) == 1
    _, metrics = http(shared_server.url("/metrics"))
    assert ':tensorflow:serving:request_count{model_name="ctr",status="INTERNAL"}' not in metrics
    assert ':tensorflow:serving:request_count{model_name="ctr",status="INVALID_ARGUMENT"}' in metrics


def test_nonfinite_values_reach_the_model_with_allow_nonfinite_but_no_nan_prediction_leaves(
    start_server, model_repo
) -> None:
    server = start_server(model_repo, "--allow_nonfinite")
    raw = ('{"instances": [[' + ", ".join(["NaN"] + ["0.5"] * 127) + "]]}").encode()
    status, body = http(server.url("/v1/models/ctr:predict"), raw=raw)
    # Past the input check (no 400); this MLP turns the NaN into a NaN score, which is withheld (500).
    assert status == 500
    assert body["error"].startswith("the model's output for instance 0 is nan (not finite; 1 of 1 instances)")
