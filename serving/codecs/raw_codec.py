"""The exact path of raw Criteo rows -> the `raw` signature's RawBatch: REST instances or columnar inputs (after
orjson), and gRPC tensors.

A REST body reaches it when the native scan (serving/codecs/raw_body.py, the one fast path) declined it, or
when the scan is not built: it checks every value, serves what is valid and names the first bad instance and
field of anything else.

The raw signature takes I1..I13 as float64 (N,) with NaN = missing and C1..C26 as strings (N,) with "" =
missing (see ctr_features/compiled/onnx_graph.py). A field that is absent, `null` or `""` is missing, exactly like an empty
cell in a Criteo file, so an all-missing row (`{}`) is valid. Counts are integers: JSON integers, integral
floats or numeric strings, within ±2**53 (exact in float64). Anything else is a 400 naming the field and the
instance: an unknown field, a count that is not a number, fractional or out of range, a categorical that is
not a string, a row that is not an object.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from serving import protos
from serving.errors import InvalidArgument

MAX_COUNT = 2**53  # the largest integer range float64 holds exactly
_NUMERIC = {f: i for i, f in enumerate(NUMERIC_FIELDS)}
_CATEGORICAL = {f: j for j, f in enumerate(CATEGORICAL_FIELDS)}
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_FIELDS_HINT = "raw fields are I1..I13 (counts) and C1..C26 (strings)"
_MISSING_HINT = 'null or "" (missing)'

DT = {
    n: protos.enum_value("tensorflow.DataType", n)
    for n in ("DT_DOUBLE", "DT_FLOAT", "DT_INT64", "DT_INT32", "DT_STRING")
}


def looks_raw(rows: Any, columnar: bool, input_name: str) -> bool:
    """True when a body with no `signature_name` carries raw field names (or an empty row) and not `input_name`."""
    first = rows if columnar else (rows[0] if isinstance(rows, list) and rows else None)
    if not isinstance(first, dict) or input_name in first:
        return False
    return not first or any(k in _NUMERIC or k in _CATEGORICAL for k in first)


def _shown(value: Any) -> str:
    """`value` as JSON, cut to 40 characters, for an error message."""
    try:
        return json.dumps(value, ensure_ascii=False)[:40]
    except (RecursionError, ValueError):
        return f"a {type(value).__name__}"


def count_value(value: Any, where: str) -> float:
    """One count -> float64 (NaN when missing); `where` names the instance and field in errors."""
    if value is None or value == "":
        return math.nan
    kind = type(value)
    if kind is int:
        if -MAX_COUNT <= value <= MAX_COUNT:
            return float(value)
    elif kind is float:
        if value != value:  # NaN: TF Serving's JSON token for a missing number
            return math.nan
        if math.isfinite(value) and not value.is_integer():
            raise InvalidArgument(f"{where} is {_shown(value)}, a fractional count; counts are integers")
        if -MAX_COUNT <= value <= MAX_COUNT:
            return value
    elif kind is str:
        text = value.strip()
        if text.isascii() and _INTEGER.fullmatch(text):
            return (
                count_value(int(text), where) if abs(int(text)) <= MAX_COUNT else _out_of_range(value, where)
            )
        if text.isascii() and _DECIMAL.fullmatch(text):
            number = float(text)
            if math.isfinite(number) and not number.is_integer():
                raise InvalidArgument(f"{where} is {_shown(value)}, a fractional count; counts are integers")
            return _out_of_range(value, where) if not -MAX_COUNT <= number <= MAX_COUNT else number
        raise InvalidArgument(
            f"{where} is {_shown(value)}, not a count; send an integer, a numeric string, {_MISSING_HINT}"
        )
    else:
        raise InvalidArgument(
            f"{where} is {_shown(value)} ({kind.__name__}), not a count; send an integer, a numeric string, "
            f"{_MISSING_HINT}"
        )
    return _out_of_range(value, where)


def _out_of_range(value: Any, where: str) -> float:
    raise InvalidArgument(
        f"{where} is {_shown(value)}, out of range; counts must be within ±{MAX_COUNT} (2**53)"
    )


def category_value(value: Any, where: str) -> str:
    """One categorical -> str ("" when missing); a string UTF-8 cannot hold (a lone surrogate) is a 400."""
    if type(value) is str:
        if not value.isascii():
            _check_encodable(value, where)
        return value
    if value is None:
        return ""
    raise InvalidArgument(
        f"{where} is {_shown(value)} ({type(value).__name__}), not a string; send a string, {_MISSING_HINT}"
    )


def _check_encodable(value: str, where: str) -> None:
    """JSON's `"\\ud800"` escape decodes to a lone surrogate, which no UTF-8 string (nor the model) can hold."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start : exc.end].encode("unicode_escape").decode()
        raise InvalidArgument(
            f"{where} holds {bad} at character {exc.start}, a lone UTF-16 surrogate that is not text; "
            "send valid Unicode (a surrogate pair or the character itself)"
        ) from exc


def decode_instances(rows: Any) -> RawBatch:
    """REST row format: `[{"I1": 3, "C1": "68fd1e64", ...}, ...]`."""
    if not isinstance(rows, list):
        raise InvalidArgument(
            f"'instances' must be a list of objects of raw Criteo fields, got {type(rows).__name__}"
        )
    # Python lists, one numpy conversion at the end: item assignment into arrays costs more than the lookups.
    numeric_rows, categorical_rows = [], []
    numeric_index, categorical_index, nan = _NUMERIC, _CATEGORICAL, math.nan
    for i, row in enumerate(rows):
        if type(row) is not dict:
            raise InvalidArgument(
                f"instance {i} is {_shown(row)} ({type(row).__name__}), expected an object of raw Criteo "
                'fields such as {"I1": 3, "C1": "68fd1e64"}'
            )
        numeric = [nan] * len(NUMERIC_FIELDS)
        categorical = [""] * len(CATEGORICAL_FIELDS)
        for key, value in row.items():
            col = numeric_index.get(key)
            if col is not None:
                if type(value) is int and -MAX_COUNT <= value <= MAX_COUNT:  # the common case, inline
                    numeric[col] = value
                else:
                    numeric[col] = count_value(value, f"instance {i} field '{key}'")
                continue
            col = categorical_index.get(key)
            if col is None:
                raise InvalidArgument(f"instance {i} has unknown field {_shown(key)}; {_FIELDS_HINT}")
            categorical[col] = (
                value
                if type(value) is str and value.isascii()
                else category_value(value, f"instance {i} field '{key}'")
            )
        numeric_rows.append(numeric)
        categorical_rows.append(categorical)
    # reshape: an empty list of rows is (0, 13) and (0, 26), an empty batch that validation names.
    return RawBatch.from_rows(
        np.array(numeric_rows, np.float64).reshape(-1, len(NUMERIC_FIELDS)),
        np.array(categorical_rows, object).reshape(-1, len(CATEGORICAL_FIELDS)),
    )


def decode_columns(columns: Any) -> RawBatch:
    """REST columnar format: `{"I1": [3, null], "C1": ["68fd1e64", ""], ...}`; an absent field is all missing."""
    if not isinstance(columns, dict):
        raise InvalidArgument(
            f"'inputs' must be an object of raw Criteo fields, got {type(columns).__name__}"
        )
    for key, value in columns.items():
        if key not in _NUMERIC and key not in _CATEGORICAL:
            raise InvalidArgument(f"'inputs' has unknown field {_shown(key)}; {_FIELDS_HINT}")
        if not isinstance(value, list):
            raise InvalidArgument(
                f"'inputs' field '{key}' is {_shown(value)} ({type(value).__name__}), expected a list with one "
                "value per instance"
            )
    lengths = {k: len(v) for k, v in columns.items()}
    if len(set(lengths.values())) > 1:
        raise InvalidArgument(
            f"'inputs' fields have different lengths {lengths}; send one value per instance"
        )
    n = next(iter(lengths.values()), 0)  # 0: an empty batch, named by validation
    numeric = np.full((n, len(NUMERIC_FIELDS)), np.nan)
    categorical = np.full((n, len(CATEGORICAL_FIELDS)), "", dtype=object)
    for key, values in columns.items():
        if key in _NUMERIC:
            numeric[:, _NUMERIC[key]] = [
                count_value(v, f"instance {i} field '{key}'") for i, v in enumerate(values)
            ]
        else:
            categorical[:, _CATEGORICAL[key]] = [
                category_value(v, f"instance {i} field '{key}'") for i, v in enumerate(values)
            ]
    return RawBatch.from_rows(numeric, categorical)


def decode_rest(rows: Any, columnar: bool) -> RawBatch:
    """A REST predict body's `instances` or `inputs` for the `raw` signature."""
    return decode_columns(rows) if columnar else decode_instances(rows)


def _tensor_values(tensor: Any, key: str) -> tuple[list[Any] | np.ndarray, int]:
    """A 1-D TensorProto's values and length, from its repeated field or `tensor_content`."""
    dims = [int(d.size) for d in tensor.tensor_shape.dim]
    if tensor.tensor_shape.unknown_rank or len(dims) != 1 or dims[0] < 0:
        raise InvalidArgument(f"input '{key}' has shape {dims}; raw inputs are 1-D: [N], one value per row")
    n = dims[0]
    dtype = tensor.dtype
    if dtype == DT["DT_STRING"]:
        values: list[Any] | np.ndarray = list(tensor.string_val)
    else:
        layout = {
            DT["DT_DOUBLE"]: ("<f8", "double_val"),
            DT["DT_FLOAT"]: ("<f4", "float_val"),
            DT["DT_INT64"]: ("<i8", "int64_val"),
            DT["DT_INT32"]: ("<i4", "int_val"),
        }
        if dtype not in layout or key in _CATEGORICAL:
            want = (
                "DT_STRING"
                if key in _CATEGORICAL
                else "DT_DOUBLE (or DT_FLOAT, DT_INT64, DT_INT32, DT_STRING)"
            )
            got = protos.pool().FindEnumTypeByName("tensorflow.DataType").values_by_number.get(dtype)
            raise InvalidArgument(f"input '{key}' has dtype {got.name if got else dtype}, expected {want}")
        np_type, field = layout[dtype]
        if tensor.tensor_content:
            if len(tensor.tensor_content) != n * np.dtype(np_type).itemsize:
                raise InvalidArgument(
                    f"input '{key}' tensor_content has {len(tensor.tensor_content)} bytes for shape [{n}]"
                )
            values = np.frombuffer(tensor.tensor_content, np_type)
        else:
            values = np.asarray(getattr(tensor, field))
    if len(values) != n:
        raise InvalidArgument(f"input '{key}' has {len(values)} values for shape [{n}]")
    return values, n


def decode_tensors(inputs: Any) -> RawBatch:
    """gRPC `PredictRequest.inputs` for the `raw` signature: C* DT_STRING [N]; I* DT_DOUBLE (NaN = missing),
    DT_FLOAT, DT_INT64, DT_INT32 or DT_STRING ("" = missing) [N]. An absent input is all missing."""
    decoded: dict[str, tuple[list[Any] | np.ndarray, int]] = {}
    for key in inputs:
        if key not in _NUMERIC and key not in _CATEGORICAL:
            raise InvalidArgument(f"inputs has unknown field {_shown(key)}; {_FIELDS_HINT}")
        decoded[key] = _tensor_values(inputs[key], key)
    # Schema order, not the proto map's (which is unordered): the message is the same on every run.
    lengths = {k: decoded[k][1] for k in (*NUMERIC_FIELDS, *CATEGORICAL_FIELDS) if k in decoded}
    if len(set(lengths.values())) > 1:
        raise InvalidArgument(f"raw inputs have different lengths {lengths}; send one value per row in each")
    n = next(iter(lengths.values()), 0)  # 0: an empty batch, named by validation
    numeric = np.full((n, len(NUMERIC_FIELDS)), np.nan)
    categorical = np.full((n, len(CATEGORICAL_FIELDS)), "", dtype=object)
    for key, (values, _) in decoded.items():
        if key in _CATEGORICAL:
            try:
                categorical[:, _CATEGORICAL[key]] = list(map(bytes.decode, values))
            except UnicodeDecodeError as exc:
                row = next(i for i, v in enumerate(values) if not _is_utf8(v))
                raise InvalidArgument(
                    f"row {row} field '{key}' is {values[row][:40]!r}, not UTF-8 text; send UTF-8 strings"
                ) from exc
        elif isinstance(values, np.ndarray) and values.dtype.kind == "f":
            numeric[:, _NUMERIC[key]] = _check_floats(values.astype(np.float64), key)
        elif isinstance(values, np.ndarray):
            numeric[:, _NUMERIC[key]] = [
                count_value(int(v), f"row {i} field '{key}'") for i, v in enumerate(values)
            ]
        else:
            numeric[:, _NUMERIC[key]] = [
                count_value(v.decode("utf-8", "replace"), f"row {i} field '{key}'")
                for i, v in enumerate(values)
            ]
    return RawBatch.from_rows(numeric, categorical)


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _check_floats(values: np.ndarray, key: str) -> np.ndarray:
    """Float counts: NaN is missing; the first infinite, fractional or out-of-range value is a 400."""
    present = ~np.isnan(values)
    bad = present & ~((np.abs(values) <= MAX_COUNT) & (np.floor(values) == values))
    if bad.any():
        i = int(np.argmax(bad))
        count_value(float(values[i]), f"row {i} field '{key}'")  # raises with the exact message
    return values
