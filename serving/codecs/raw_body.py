"""The fast paths of raw REST bodies: JSON bytes -> a field-major RawBatch, natively or through msgspec.

Every body, in row format or columnar (`inputs`), is first scanned by a small C extension
(serving/codecs/_raw_native.c) straight into the counts and the categorical values' keys, with no Python
object per value (ctr_features/compiled/few_rows.py transforms a few keyed rows natively too). It takes a strict
subset of JSON (integral counts of up to 15 digits, "" or null; categoricals of up to 8 ASCII characters or
null; no escapes, no repeated or unknown keys; at most MAX_SCAN_ROWS rows) and declines anything else, which
then goes the msgspec way below (row format) or the exact path (columnar). The values themselves are made from
the keys only if something reads them (`RawBatch.of_keys`). Without the extension (a source checkout not
installed) the msgspec path serves alone.

`{"instances": [{"I1": 3, "C1": "68fd1e64", ...}, ...], "signature_name"?: "raw"}` is decoded by msgspec
straight into one small struct per row (no dict per row, no key lookups in Python), checked as it is read:
a count is a JSON integer or an integral float strictly within ±2**53, "" or null; a categorical is a string
or null; no other field, no other key in the envelope. The rows are then turned into columns with C-level
calls (`astuple`, `zip`, one numpy conversion per kind) and the join that gives the categorical keys
(ctr_features/compiled/value_table.py). Any body this does not take (a numeric string, a boolean, an unknown
field, columnar `inputs`, malformed JSON, no rows...) returns None and goes the way it always went
(serving/codecs/rest_codec.py: orjson, then serving/codecs/raw_codec.py), which serves or names the
instance and field with the same message as before. So this module never raises for a client's mistake.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import DICT_ROWS
from ctr_features.compiled.value_table import RawKeys
from serving.signatures import RAW_SIGNATURE

try:
    from serving.codecs._raw_native import scan as _scan
except ImportError:  # not built: `pip install -e .` (make install) builds it
    _scan = None
NATIVE = _scan is not None  # the server logs which decoder it runs (serving/app/server.py)
# The scan's bound on rows (and so on its memory, 39 * 8 bytes a row); a larger body goes the other ways,
# whose --max_instances check answers it.
MAX_SCAN_ROWS = 65536

_LIMIT = 2**53  # counts within ±2**53 exclusive: the bounds themselves go to the exact path, which names them
Count = (
    Annotated[int, msgspec.Meta(gt=-_LIMIT, lt=_LIMIT)]
    | Annotated[float, msgspec.Meta(gt=-_LIMIT, lt=_LIMIT, multiple_of=1)]  # integral floats (3.0, 1e3)
    | Annotated[str, msgspec.Meta(max_length=0)]  # "", a missing count
    | None
)
# An absent count is None (NaN) and an absent categorical "" (the missing value): nothing to replace after.
RawRow = msgspec.defstruct(
    "RawRow",
    [(f, Count, None) for f in NUMERIC_FIELDS] + [(f, str | None, "") for f in CATEGORICAL_FIELDS],
    forbid_unknown_fields=True,
    gc=False,  # rows hold no containers: no cycle tracking for thousands of small objects
)
RawInstances = msgspec.defstruct(
    "RawInstances",
    [("instances", list[RawRow]), ("signature_name", Literal[RAW_SIGNATURE], RAW_SIGNATURE)],  # type: ignore[valid-type]
    forbid_unknown_fields=True,
    gc=False,
)
_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(RawInstances)
_N_NUM = len(NUMERIC_FIELDS)
_BLANK_IS_MISSING = {"": None}  # dict.get(v, v): "" -> None (NaN), any other value itself
_NULL_IS_BLANK = {None: ""}


def client_rows(numeric: np.ndarray, categorical: np.ndarray) -> list[dict[str, Any]]:
    """Row-major (N, 13) counts and (N, 26) values as a REST client sends them, every form in turn: counts as
    ints or integral floats, missing as absent, null or "" (a non-finite count cannot be sent: JSON has none,
    so it is absent too); values as strings, "" as itself, absent or null. The gates send the rows through the
    server's decoder in these forms (export/gates/raw_parity.py, serving/repository/warmup.py)."""
    rows = []
    for i, (counts, strings) in enumerate(zip(numeric.tolist(), categorical.tolist(), strict=True)):
        row: dict[str, Any] = {}
        for j, (field, x) in enumerate(zip(NUMERIC_FIELDS, counts, strict=True)):
            if math.isfinite(x):
                row[field] = int(x) if (i + j) % 2 and x.is_integer() else x
            elif (i + j) % 3:
                row[field] = [None, ""][(i + j) % 3 - 1]
        for j, (field, value) in enumerate(zip(CATEGORICAL_FIELDS, strings, strict=True)):
            if value or (i + j) % 3 == 1:
                row[field] = value
            elif (i + j) % 3 == 2:
                row[field] = None
        rows.append(row)
    return rows


def json_can_carry(numeric: np.ndarray) -> bool:
    """Whether a client can send these counts as JSON: every present one finite and integral."""
    counts = numeric[~np.isnan(numeric)]
    return bool(np.isfinite(counts).all() and (counts == np.floor(counts)).all())


def client_columns(numeric: np.ndarray, categorical: np.ndarray) -> dict[str, list[Any]]:
    """The same rows as a columnar `inputs` object (`client_rows`' forms, one per field in turn): a field
    whose values are all missing is absent in every third field, as a client may leave it out."""
    columns: dict[str, list[Any]] = {}
    for j, (field, values) in enumerate(zip(NUMERIC_FIELDS, numeric.T.tolist(), strict=True)):
        if j % 3 or any(math.isfinite(x) for x in values):
            columns[field] = [
                (int(x) if j % 2 and x.is_integer() else x) if math.isfinite(x) else [None, ""][j % 2]
                for x in values
            ]
    for j, (field, strings) in enumerate(zip(CATEGORICAL_FIELDS, categorical.T.tolist(), strict=True)):
        if j % 3 or any(strings):
            columns[field] = [v if v or j % 2 else None for v in strings]
    return columns


def decode_raw_body(body: bytes | bytearray) -> tuple[bool, RawBatch] | None:
    """A raw REST body -> (columnar format?, its RawBatch), or None: the exact path's to decode. The native scan
    takes row and columnar bodies of its JSON subset; msgspec, the other row bodies it can."""
    if _scan is not None:
        found = _scan(body, 1, MAX_SCAN_ROWS)
        if found is not None:
            n, counts, keys, columnar = found
            key = np.frombuffer(keys, np.uint64).reshape(len(CATEGORICAL_FIELDS), n)
            return columnar, RawBatch.of_keys(np.frombuffer(counts).reshape(_N_NUM, n), RawKeys(key, None))
    batch = _decode_typed(body)
    return None if batch is None else (False, batch)


def decode_raw_instances(body: bytes | bytearray) -> RawBatch | None:
    """A raw REST body in row format -> a RawBatch (with its keys), or None: the exact path's to decode."""
    found = decode_raw_body(body)
    return found[1] if found is not None and not found[0] else None


def _decode_typed(body: bytes | bytearray) -> RawBatch | None:
    """msgspec's typed decode of a row-format body, or None."""
    try:
        rows = _DECODER.decode(body).instances
    except msgspec.DecodeError:  # malformed JSON, or a value the types above do not take (ValidationError)
        return None
    n = len(rows)
    if not n:
        return None  # no rows: which message (raw or features) depends on the exact path's rules
    if n == 1:  # one row is already field-major: no transpose
        row = msgspec.structs.astuple(rows[0])
        numeric, strings = _few_counts(list(row[:_N_NUM]), 1), list(row[_N_NUM:])
    else:
        columns = list(zip(*map(msgspec.structs.astuple, rows), strict=True))  # 39 tuples of N values
        numeric = _counts(columns[:_N_NUM], n)
        strings = list(chain.from_iterable(columns[_N_NUM:]))  # field-major, as the batch holds them
    if None in strings:
        strings = list(map(_NULL_IS_BLANK.get, strings, strings))
    if n <= DICT_ROWS:  # keyed when the transform asks (RawBatch.keys, in C)
        return RawBatch.of_strings(numeric, strings)
    # in C, or by the numpy join; None: by dict (a lone surrogate: msgspec refuses them first)
    return RawBatch.of_strings(numeric, strings, RawKeys.of_list(strings, (len(CATEGORICAL_FIELDS), n)), True)


def _counts(columns: list[tuple[Any, ...]], n: int) -> np.ndarray:
    """13 tuples of N counts (int, integral float, None or "") -> float64 (13, N), NaN = missing."""
    if n <= DICT_ROWS:  # one numpy call (~1 µs each)
        return _few_counts(list(chain.from_iterable(columns)), n)
    numeric = np.empty((_N_NUM, n))
    for j, values in enumerate(columns):  # by field: a "" costs a second pass over its own field only
        try:
            numeric[j] = values  # None -> NaN
        except ValueError:
            numeric[j] = list(map(_BLANK_IS_MISSING.get, values, values))
    return numeric


def _few_counts(values: list[Any], n: int) -> np.ndarray:
    """13 * N counts, field-major -> float64 (13, N), in one numpy call."""
    if "" in values:
        values = list(map(_BLANK_IS_MISSING.get, values, values))
    return np.array(values, np.float64).reshape(_N_NUM, n)  # None -> NaN
