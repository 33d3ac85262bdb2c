"""The fast path of raw REST bodies: JSON bytes -> a field-major RawBatch, scanned natively (`scan`, which
serving/codecs/rest_codec.py's `decode_raw_body` calls).

Every body, in row format or columnar (`inputs`), is first scanned by a small C extension
(serving/codecs/_scan_native.c) straight into the counts and the categorical values' keys, numpy arrays made
in C, with no Python object per value (ctr_features/compiled/few_rows.py transforms a few keyed rows natively
too). It takes a strict subset of JSON (integral counts of up to 15 digits, "" or null; categoricals of up to 8 ASCII characters or
null; no escapes, no repeated or unknown keys; at most MAX_SCAN_ROWS rows) and declines anything else, which
then goes the one other way: orjson, then the exact path (serving/codecs/raw_codec.py), which serves the body
or names the instance and field of its error. The values themselves are made from the keys only if something
reads them (`RawBatch.of_scan`). Without the extension (a source checkout not installed) the exact path serves
alone. So this module never raises for a client's mistake, and decides nothing alone.

`client_rows` and `client_columns` write rows as REST clients send them, for the gates that send rows through
the server's decoder (serving/repository/warmup.py) and for the tests that compare the two paths.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS

try:  # (columnar, counts float64 (13, n), keys uint64 (26, n)) or None; the C module's `scan` gives bytes
    from serving.codecs._scan_native import arrays as scan
except ImportError:  # not built: `pip install -e .` (make install) builds it
    scan = None
NATIVE = scan is not None  # the server logs which decoder it runs (serving/app/server.py)
# The scan's bound on rows (and so on its memory, 39 * 8 bytes a row); a larger body goes the exact way,
# whose --max_instances check answers it.
MAX_SCAN_ROWS = 65536


def client_rows(numeric: np.ndarray, categorical: np.ndarray) -> list[dict[str, Any]]:
    """Row-major (N, 13) counts and (N, 26) values as a REST client sends them, every form in turn: counts as
    ints or integral floats, missing as absent, null or "" (a non-finite count cannot be sent: JSON has none,
    so it is absent too); values as strings, "" as itself, absent or null. The warm-up sends its rows through the
    server's decoders in these forms (serving/repository/warmup.py), and so do the tests comparing them."""
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
