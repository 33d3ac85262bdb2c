"""Open Inference Protocol v2 tensors ⇄ the batches the predictor runs, shared by REST and gRPC.

Two v2 models stand for each served model M: `M` is `serving_default` (`features` FP32 [-1, F] -> `ctr`
FP32 [-1, K], then `raw_score` FP32 [-1, K] in versions that serve it) and `M_raw` is the `raw` signature
(I1..I13 FP64 [-1] with NaN = missing, C1..C26 BYTES [-1]; an absent input is all missing, as in a Criteo
file; the same outputs). Each decoded tensor is a `V2Tensor`; `to_batch` checks its
name, datatype and shape against the signature and builds the float32 (N, F) batch or the RawBatch.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from serving.codecs.raw_codec import category_value, count_value
from serving.errors import InvalidArgument
from serving.requests import DecodedRequest
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature

RAW_SUFFIX = "_" + RAW_SIGNATURE
# v2 datatype -> little-endian numpy dtype; BYTES elements are 4-byte little-endian lengths + bytes.
NUMPY_TYPES = {
    "BOOL": "|b1",
    "UINT8": "|u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "|i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
PLATFORMS = {"ONNXRuntime": "onnxruntime_onnx", "TF2": "tensorflow_savedmodel"}
_NUMERIC = set(NUMERIC_FIELDS)
_CATEGORICAL = set(CATEGORICAL_FIELDS)


@dataclass(frozen=True)
class V2Tensor:
    """One decoded input: `values` is a flat numpy array, or a list of str/bytes for BYTES."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: np.ndarray | list[Any]


def check_text(value: str, where: str) -> str:
    """A string the server may echo: valid Unicode that UTF-8 can hold, else a 400 naming `where`.

    JSON's `"\\ud800"` escape decodes to a lone surrogate, which no UTF-8 response (nor log line) can hold.
    """
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start : exc.end].encode("unicode_escape").decode()
        raise InvalidArgument(
            f"{where} is not valid UTF-8: it holds {bad} at character {exc.start}, a lone UTF-16 surrogate; "
            "send valid Unicode (a surrogate pair or the character itself)"
        ) from exc
    return value


def check_header_text(doc: dict[str, Any]) -> None:
    """Every string of a v2 JSON header but the tensors' data: the id, names, datatypes and parameters."""
    if isinstance(doc.get("id"), str):
        check_text(doc["id"], "the request id ('id')")
    _check_parameters_text(doc.get("parameters"), "parameters")
    for field in ("inputs", "outputs"):
        items = doc.get(field)
        for i, item in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(item, dict):
                continue
            for key in ("name", "datatype"):
                if isinstance(item.get(key), str):
                    check_text(item[key], f"{field}[{i}].{key}")
            _check_parameters_text(item.get("parameters"), f"{field}[{i}].parameters")


def _check_parameters_text(parameters: Any, where: str) -> None:
    if not isinstance(parameters, dict):
        return
    for key, value in parameters.items():
        check_text(key, f"a key of {where}")
        if isinstance(value, str):
            check_text(value, f"{where}.{key}")


def split_model_name(v2_name: str, served: set[str]) -> tuple[str, str]:
    """The v2 model name -> (served model name, signature key): `ctr` -> serving_default, `ctr_raw` -> raw."""
    if v2_name not in served and v2_name.endswith(RAW_SUFFIX) and v2_name[: -len(RAW_SUFFIX)] in served:
        return v2_name[: -len(RAW_SUFFIX)], RAW_SIGNATURE
    return v2_name, DEFAULT_SIGNATURE


def io_spec(sig: Signature, signature: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) metadata of one v2 model: `[{"name", "datatype", "shape"}, ...]`."""
    outputs = [{"name": n, "datatype": "FP32", "shape": [-1, sig.output_width]} for n in sig.output_names]
    if signature == RAW_SIGNATURE:
        inputs = [{"name": f, "datatype": "FP64", "shape": [-1]} for f in NUMERIC_FIELDS]
        inputs += [{"name": f, "datatype": "BYTES", "shape": [-1]} for f in CATEGORICAL_FIELDS]
        return inputs, outputs
    return [{"name": sig.input_name, "datatype": "FP32", "shape": [-1, sig.width]}], outputs


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    """A tensor's shape as non-negative ints, or a 400 naming the input."""
    if not isinstance(shape, list | tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidArgument(f"input '{name}' has shape {shape!r}; send a list of non-negative integers")
    return tuple(shape)


def from_bytes(name: str, datatype: str, shape: tuple[int, ...], data: bytes | memoryview) -> V2Tensor:
    """A tensor sent as raw bytes (REST binary extension, gRPC raw_input_contents)."""
    n = math.prod(shape)
    if datatype == "BYTES":
        values: list[Any] = []
        view, offset = memoryview(data), 0
        while offset + 4 <= len(view):
            (length,) = struct.unpack_from("<I", view, offset)
            values.append(bytes(view[offset + 4 : offset + 4 + length]))
            offset += 4 + length
        if offset != len(view) or len(values) != n:
            raise InvalidArgument(
                f"input '{name}' BYTES data holds {len(values)} length-prefixed elements in {len(view)} bytes, "
                f"expected {n} for shape {list(shape)} (each: 4-byte little-endian length, then the bytes)"
            )
        return V2Tensor(name, datatype, shape, values)
    dtype = NUMPY_TYPES.get(datatype)
    if dtype is None:
        raise InvalidArgument(f"input '{name}' has datatype {datatype!r}, not a v2 datatype")
    size = np.dtype(dtype).itemsize
    if len(data) != n * size:
        raise InvalidArgument(
            f"input '{name}' has {len(data)} bytes of data, expected {n * size} for {datatype} shape {list(shape)}"
        )
    return V2Tensor(name, datatype, shape, np.frombuffer(data, dtype))


def from_values(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> V2Tensor:
    """A tensor sent as values (REST JSON `data`, flat or nested; gRPC `contents`)."""
    n = math.prod(shape)
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != n:
            raise InvalidArgument(
                f"input '{name}' has {len(flat)} values, expected {n} for shape {list(shape)}"
            )
        return V2Tensor(name, datatype, shape, flat)
    dtype = NUMPY_TYPES.get(datatype)
    if dtype is None:
        raise InvalidArgument(f"input '{name}' has datatype {datatype!r}, not a v2 datatype")
    try:
        # null -> NaN: JSON has no NaN token of its own (the NaN literal is accepted too)
        array = np.asarray(data, dtype=np.float64 if dtype[1] == "f" else None)
    except (ValueError, TypeError):
        array = None
    if array is None or array.dtype.kind not in "biuf" or array.size != n:
        got = (
            "ragged or non-numeric values" if array is None or array.dtype.kind not in "biuf" else array.size
        )
        raise InvalidArgument(
            f"input '{name}' {datatype} data has {got}, expected {n} numbers for shape {list(shape)}"
        )
    return V2Tensor(name, datatype, shape, array.reshape(-1).astype(dtype, copy=False))


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    return [v for item in data for v in _flatten(item)]


def to_request(tensors: list[V2Tensor], sig: Signature, signature: str) -> DecodedRequest:
    """The request's tensors -> the DecodedRequest of its signature (400 naming the input when wrong)."""
    return DecodedRequest(signature, _to_batch(tensors, sig, signature))


def _to_batch(tensors: list[V2Tensor], sig: Signature, signature: str) -> np.ndarray | RawBatch:
    """Float32 (N, F) features, or a RawBatch for the raw signature."""
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"inputs name {sorted(n for n in names if names.count(n) > 1)[0]!r} twice")
    if signature == RAW_SIGNATURE:
        return _raw_batch(tensors)
    if names != [sig.input_name]:
        raise InvalidArgument(
            f"inputs are {names}, expected exactly ['{sig.input_name}'] (FP32 [N, {sig.width}])"
        )
    (tensor,) = tensors
    if tensor.datatype != "FP32":
        raise InvalidArgument(f"input '{tensor.name}' has datatype {tensor.datatype}, expected FP32")
    if len(tensor.shape) != 2 or tensor.shape[1] != sig.width:
        raise InvalidArgument(
            f"input '{tensor.name}' has shape {list(tensor.shape)}, expected [N, {sig.width}]"
        )
    assert isinstance(tensor.values, np.ndarray)
    return tensor.values.reshape(tensor.shape)


def _raw_batch(tensors: list[V2Tensor]) -> RawBatch:
    lengths = {}
    for t in tensors:
        if t.name not in _NUMERIC and t.name not in _CATEGORICAL:
            raise InvalidArgument(
                f"input '{t.name}' is not a raw Criteo field; inputs are I1..I13 (FP64) and C1..C26 (BYTES)"
            )
        want = "FP64" if t.name in _NUMERIC else "BYTES"
        if t.datatype != want:
            raise InvalidArgument(f"input '{t.name}' has datatype {t.datatype}, expected {want}")
        if len(t.shape) != 1:
            raise InvalidArgument(
                f"input '{t.name}' has shape {list(t.shape)}, expected [N]: one value per row"
            )
        lengths[t.name] = t.shape[0]
    if len(set(lengths.values())) > 1:
        raise InvalidArgument(f"raw inputs have different lengths {lengths}; send one value per row in each")
    n = next(iter(lengths.values()), 0)
    if n == 0:
        raise InvalidArgument(f"empty batch: no rows for model '*{RAW_SUFFIX}'; send at least one")
    numeric = np.full((len(NUMERIC_FIELDS), n), np.nan)
    categorical = np.full((len(CATEGORICAL_FIELDS), n), "", dtype=object)
    for t in tensors:
        if t.name in _NUMERIC:
            assert isinstance(t.values, np.ndarray)
            numeric[NUMERIC_FIELDS.index(t.name)] = _counts(t.values, t.name)
        else:
            categorical[CATEGORICAL_FIELDS.index(t.name)] = [
                _text(v, f"row {i} field '{t.name}'") for i, v in enumerate(t.values)
            ]
    return RawBatch(numeric, categorical)


def _counts(values: np.ndarray, name: str) -> np.ndarray:
    """FP64 counts: NaN is missing; the first infinite, fractional or out-of-range value is a 400."""
    present = ~np.isnan(values)
    bad = present & ~((np.abs(values) <= 2**53) & (np.floor(values) == values))
    if bad.any():
        i = int(np.argmax(bad))
        count_value(float(values[i]), f"row {i} field '{name}'")  # raises with the v1 raw message
    return values


def _text(value: Any, where: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"{where} is {value[:40]!r}, not UTF-8 text; send UTF-8 strings") from exc
    return category_value(value, where)
