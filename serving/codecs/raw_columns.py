"""The fast path of raw REST decoding: rows or columns of parsed JSON -> a RawBatch, with no per-value Python.

Well-formed bodies (counts as JSON integers, integral floats, null or ""; categoricals as strings or null;
only known fields) are turned into columns by C-level calls (dict merges, itemgetters, `map(type, ...)`,
numpy conversions) and checked with vectorised comparisons. Anything else returns None, and the caller's
per-value path (serving/codecs/raw_codec.py) decodes the body again and names the first bad instance and
field with the exact message. So this module never raises for a client's mistake and decides nothing alone.
The one join of the categorical values that checks them also gives their keys for the batch-wide lookups
(ctr_features/compiled/value_table.py), so the transform and drift binning need not join them again.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.value_table import RawKeys, join

_LIMIT = float(2**53)  # counts are within ±2**53, the integers float64 holds exactly
# Below this many rows the per-value loop is as fast as the dozen numpy calls here (~1-2 µs each).
FAST_MIN_ROWS = 8
# An absent count is None (NaN), an absent categorical "" (the value of a missing one): no null to replace.
_ALL_MISSING = dict.fromkeys(NUMERIC_FIELDS) | dict.fromkeys(CATEGORICAL_FIELDS, "")
_N_FIELDS = len(_ALL_MISSING)
_NUMERIC = itemgetter(*NUMERIC_FIELDS)
_CATEGORICAL = itemgetter(*CATEGORICAL_FIELDS)
_NUMBERS = frozenset({int, float, type(None)})
_NUMBERS_OR_BLANK = _NUMBERS | {str}
_STRINGS = frozenset({str, type(None)})
_BLANK_IS_MISSING = {"": None}  # dict.get(v, v): "" -> None, any other value itself
_NULL_IS_BLANK = {None: ""}


def counts(values: list[Any], n: int) -> np.ndarray | None:
    """Count values (row- or field-major, `n` per line) -> float64 (-1, n), NaN = missing; None: not plain."""
    types = set(map(type, values))
    if not types <= _NUMBERS_OR_BLANK:
        return None  # booleans, lists, objects: the exact path names them
    if str in types:
        values = list(map(_BLANK_IS_MISSING.get, values, values))
        if str in set(map(type, values)):
            return None  # numeric strings ("3"): the exact path parses and checks them
    try:
        array = np.array(values, dtype=np.float64).reshape(-1, n)  # None -> NaN (missing)
    except (OverflowError, ValueError):  # an int beyond float64
        return None
    # Strictly inside ±2**53 (NaN, missing, compares False): an int just over it rounds onto 2**53 in
    # float64, so the bound itself goes to the exact path, which checks the int; infinities go there too.
    if (np.abs(array) >= _LIMIT).any():
        return None
    if float in types and ((np.floor(array) != array) & ~np.isnan(array)).any():
        return None  # a fractional count, for the exact path's message
    return array


def categories(values: list[Any], n: int) -> tuple[np.ndarray, RawKeys | None] | None:
    """Categorical values -> object str (-1, n), "" = missing, and their keys (ctr_features/compiled/value_table.py);
    None when one is not a string or null."""
    try:
        text = join(values)  # one C call; TypeError for a null (or a non-string, which the checks below find)
    except TypeError:
        if not set(map(type, values)) <= _STRINGS:
            return None
        values = list(map(_NULL_IS_BLANK.get, values, values))
        text = join(values)
    try:
        keys = RawKeys.of_joined(text, len(values), (-1, n))
    except UnicodeEncodeError:
        return None  # a lone surrogate ("\ud800"): the exact path's to judge
    return np.array(values, dtype=object).reshape(-1, n), keys


def fast_instances(rows: list[Any]) -> RawBatch | None:
    """REST row format -> a RawBatch, or None when a row needs the exact path (or there are few rows)."""
    if len(rows) < FAST_MIN_ROWS or set(map(type, rows)) != {dict}:
        return None
    full = list(map(_ALL_MISSING.__or__, rows))  # every row with all 39 keys, absent ones missing
    if set(map(len, full)) != {_N_FIELDS}:
        return None  # an unknown field
    numeric = counts(list(chain.from_iterable(map(_NUMERIC, full))), len(NUMERIC_FIELDS))
    categorical = categories(list(chain.from_iterable(map(_CATEGORICAL, full))), len(CATEGORICAL_FIELDS))
    if numeric is None or categorical is None:
        return None
    strings, keys = categorical
    return RawBatch.from_rows(numeric, strings, keys.transposed() if keys is not None else None)


def fast_columns(columns: dict[str, Any], n: int) -> RawBatch | None:
    """REST columnar format (fields known, lists of length `n` >= 1) -> a RawBatch, or None (exact path)."""
    numeric = np.full((len(NUMERIC_FIELDS), n), np.nan)
    categorical = np.full((len(CATEGORICAL_FIELDS), n), "", dtype=object)
    for j, field in enumerate(NUMERIC_FIELDS):
        if field in columns:
            values = counts(columns[field], n)
            if values is None:
                return None
            numeric[j] = values[0]
    for j, field in enumerate(CATEGORICAL_FIELDS):
        if field in columns:
            strings = categories(columns[field], n)
            if strings is None:
                return None
            categorical[j] = strings[0][0]
    return RawBatch(numeric, categorical)
