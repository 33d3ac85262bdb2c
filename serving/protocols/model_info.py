"""Status and metadata messages, built once as TF Serving protos and rendered as gRPC or REST JSON."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from ctr_contract.schema import CATEGORICAL_FIELDS, RAW_FIELDS
from serving import protos
from serving.codecs.tensors import DT_FLOAT
from serving.repository.states import VersionState
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature

DT_DOUBLE = protos.enum_value("tensorflow.DataType", "DT_DOUBLE")
DT_STRING = protos.enum_value("tensorflow.DataType", "DT_STRING")

PREDICT_METHOD = "tensorflow/serving/predict"


def status_response(states: list[VersionState]) -> Any:
    """GetModelStatusResponse for the given versions (newest first)."""
    response = protos.GetModelStatusResponse()
    state_enum = protos.ModelVersionStatus.State
    for s in states:
        entry = response.model_version_status.add()
        entry.version = s.version
        entry.state = state_enum.Value(s.state)
        entry.status.error_code = protos.enum_value("tensorflow.error.Code", s.error_code)
        entry.status.error_message = s.error_message
    return response


def signature_def_map(sig: Signature) -> Any:
    """SignatureDefMap with `serving_default`: features float [-1, F] -> each output float [-1, K]."""
    sig_map = protos.SignatureDefMap()
    sig_def = sig_map.signature_def[DEFAULT_SIGNATURE]
    sig_def.method_name = PREDICT_METHOD
    # The map key is the public name; `info.name` is the graph tensor name TF Serving reports.
    _tensor_info(
        sig_def.inputs[sig.input_name], f"{DEFAULT_SIGNATURE}_{sig.input_name}:0", DT_FLOAT, -1, sig.width
    )
    # TF numbers the signatures' calls by key: `raw` sorts first, so it takes the unsuffixed name.
    _add_outputs(sig_def, sig, f"StatefulPartitionedCall{'_1' if sig.has_raw else ''}")
    if sig.has_raw:
        add_raw_signature(sig_map, sig)
    return sig_map


def _tensor_info(info: Any, name: str, dtype: int, *dims: int) -> None:
    info.name = name
    info.dtype = dtype
    for size in dims:
        info.tensor_shape.dim.add().size = size


def _add_outputs(sig_def: Any, sig: Signature, call: str) -> None:
    """Each output float [-1, K]; TF names a call's results by the sorted output keys (`ctr`, `raw_score`)."""
    for i, output in enumerate(sorted(sig.output_names)):
        _tensor_info(sig_def.outputs[output], f"{call}:{i}", DT_FLOAT, -1, sig.output_width)


def add_raw_signature(sig_map: Any, sig: Signature) -> None:
    """`raw`: I1..I13 double [-1] (NaN = missing), C1..C26 string [-1] ("" = missing) -> each output float [-1, K]."""
    raw = sig_map.signature_def[RAW_SIGNATURE]
    raw.method_name = PREDICT_METHOD
    for field in RAW_FIELDS:
        dtype = DT_STRING if field in CATEGORICAL_FIELDS else DT_DOUBLE
        _tensor_info(raw.inputs[field], f"{RAW_SIGNATURE}_{field}:0", dtype, -1)
    _add_outputs(raw, sig, "StatefulPartitionedCall")


def metadata_response(model_name: str, version: int, sig: Signature) -> Any:
    """GetModelMetadataResponse with `metadata["signature_def"]` packing the SignatureDefMap."""
    response = protos.GetModelMetadataResponse()
    response.model_spec.name = model_name
    response.model_spec.version.value = version
    response.metadata["signature_def"].Pack(signature_def_map(sig))
    return response


def to_json(message: Any) -> dict[str, Any]:
    """Render a proto the way TF Serving's REST API does (proto field names, defaults included)."""
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        descriptor_pool=protos.pool(),
    )


def metadata_json(model_name: str, version: int, sig: Signature) -> dict[str, Any]:
    """REST metadata body: `{"model_spec": ..., "metadata": {"signature_def": {...}}}`."""
    spec = to_json(metadata_response(model_name, version, sig).model_spec)
    return {"model_spec": spec, "metadata": {"signature_def": to_json(signature_def_map(sig))}}
