"""serving/codecs/grpc_codec.py without a server: a PredictRequest -> DecodedRequest, exact messages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ctr_contract.signatures import DEFAULT_WIDTH
from serving import protos
from serving.codecs.grpc_codec import to_request
from serving.codecs.tensors import from_ndarray
from serving.errors import InvalidArgument
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature

SIG = Signature("features", "ctr", DEFAULT_WIDTH, 1, has_raw=True)


def request(signature_name: str = "", **inputs: np.ndarray) -> Any:
    message = protos.PredictRequest()  # the server's own descriptors: no TensorFlow import
    message.model_spec.name, message.model_spec.signature_name = "ctr", signature_name
    for key, array in inputs.items():
        from_ndarray(array, message.inputs[key])
    return message


def error_of(message: Any, sig: Signature = SIG) -> str:
    with pytest.raises(InvalidArgument) as caught:
        to_request(message, sig)
    return caught.value.message


def test_features_tensor_decodes_to_serving_default() -> None:
    x = np.arange(2 * DEFAULT_WIDTH, dtype=np.float32).reshape(2, DEFAULT_WIDTH)
    decoded = to_request(request(features=x), SIG)
    assert decoded.signature == DEFAULT_SIGNATURE and np.array_equal(decoded.batch, x)


def test_raw_field_inputs_without_a_signature_name_call_raw() -> None:
    message = request()
    message.inputs["C1"].dtype = protos.enum_value("tensorflow.DataType", "DT_STRING")
    message.inputs["C1"].tensor_shape.dim.add().size = 1
    message.inputs["C1"].string_val.append(b"68fd1e64")
    decoded = to_request(message, SIG)
    assert decoded.signature == RAW_SIGNATURE and decoded.batch.inputs["C1"].tolist() == ["68fd1e64"]


def test_unknown_signature_and_raw_without_the_raw_graph_are_not_found() -> None:
    x = np.zeros((1, DEFAULT_WIDTH), np.float32)
    assert (
        error_of(request("classify", features=x))
        == 'Serving signature name: "classify" not found in signature def'
    )
    without_raw = Signature("features", "ctr", DEFAULT_WIDTH, 1)
    assert error_of(request("raw"), without_raw) == 'Serving signature name: "raw" not found in signature def'


def test_an_output_filter_naming_another_output_is_refused() -> None:
    message = request(features=np.zeros((1, DEFAULT_WIDTH), np.float32))
    message.output_filter.append("logits")
    assert error_of(message) == "output_filter names ['logits']; the only output is 'ctr'"


def test_wrong_input_keys_are_named() -> None:
    message = request(feats=np.zeros((1, DEFAULT_WIDTH), np.float32))
    assert error_of(message) == "inputs has keys ['feats'], expected exactly ['features']"
