"""gRPC `PredictRequest` -> DecodedRequest: the signature it calls, its inputs, its output filter."""

from __future__ import annotations

from typing import Any

from serving.codecs.raw_codec import decode_tensors, looks_raw
from serving.codecs.tensors import to_ndarray
from serving.errors import InvalidArgument
from serving.requests import DecodedRequest
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature


def to_request(request: Any, sig: Signature) -> DecodedRequest:
    """Decode a `tensorflow.serving.PredictRequest` for the version whose signature is `sig`.

    With no `signature_name`, inputs named by raw Criteo fields call `raw`; otherwise `serving_default`.
    Raises InvalidArgument for an unknown signature, an output_filter naming an output the version lacks, or
    inputs that do not fit.
    """
    signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if not request.model_spec.signature_name and looks_raw(dict(request.inputs), True, sig.input_name):
        signature_name = RAW_SIGNATURE
    if signature_name not in (DEFAULT_SIGNATURE, RAW_SIGNATURE) or (
        signature_name == RAW_SIGNATURE and not sig.has_raw
    ):
        raise InvalidArgument(f'Serving signature name: "{signature_name}" not found in signature def')
    sig.requested(request.output_filter, "output_filter")  # the answer's outputs: tfs_grpc.py
    if signature_name == RAW_SIGNATURE:
        return DecodedRequest(RAW_SIGNATURE, decode_tensors(request.inputs))
    if set(request.inputs) != {sig.input_name}:
        raise InvalidArgument(
            f"inputs has keys {sorted(request.inputs)}, expected exactly ['{sig.input_name}']"
        )
    return DecodedRequest(DEFAULT_SIGNATURE, to_ndarray(request.inputs[sig.input_name], sig.input_name))
