"""The feature vector's layout, and the raw-value helpers that the spec and its fit share (numpy only).

Layout of one vector (width 128 by default; C = 26 categorical fields):
  [0, 13)         numeric z-scores: z = clip((sign(x)*log1p(|x|) - mean) / std, ±clip); 0 when missing
  [13, 26)        missing indicators for I1..I13 (1.0 = missing or non-finite)
  [26, 52)        click-rate lift of each categorical value (see `ctr_features.vocabulary`); 0 for rare/unseen
  [52, width-1)   hashed buckets: a value in its field's vocabulary adds 1.0 at
                  52 + fnv1a_32(utf8(field + ":" + value)) % (width - 53)
  width-1         out-of-vocabulary count: how many of the 26 values are not in their field's vocabulary
A missing categorical is the empty value "". Each field's vocabulary is its most frequent training values
(`vocab_size`, seen >= `vocab_min_count` times), so every table is a string -> number lookup that ONNX
(`LabelEncoder`) and TF (`StaticHashTable`) run with standard ops; see docs/raw-features.md.
The spec is data: `feature_spec.json` holds every number needed to reproduce the vectors bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.hashing import StringColumn, encode_strings
from ctr_features.vocabulary import value_array

N_NUM = len(NUMERIC_FIELDS)
N_CAT = len(CATEGORICAL_FIELDS)
LIFT_START = 2 * N_NUM  # 26: after the z-scores and the missing indicators
HASH_START = LIFT_START + N_CAT  # 52: z-scores, indicators, rate lifts come first
# The layout above as text: feature_spec.json carries it, so the file explains itself.
LAYOUT = (__doc__ or "").split("Layout of one vector", 1)[1].split("The spec is data")[0].strip()


def signed_log1p(x: np.ndarray) -> np.ndarray:
    """sign(x) * log1p(|x|): tames heavy-tailed counts and keeps Criteo's -1 values."""
    return np.sign(x) * np.log1p(np.abs(x))


def categorical_values(categorical: np.ndarray | Sequence[StringColumn], n: int) -> list[np.ndarray]:
    """The 26 fields' values as sortable byte arrays (see `ctr_features.vocabulary.value_array`), missing = b''.

    Args:
        categorical: [N, 26] array of str/None, or 26 packed `StringColumn`s (one per field).
    """
    if isinstance(categorical, np.ndarray):
        if categorical.ndim != 2 or categorical.shape != (n, N_CAT):
            raise ValueError(
                f"expected categorical fields of shape [{n}, {N_CAT}], got {list(categorical.shape)}"
            )
        columns = [encode_strings(categorical[:, j].tolist()) for j in range(N_CAT)]
    else:
        columns = list(categorical)
        if len(columns) != N_CAT:
            raise ValueError(f"expected {N_CAT} categorical columns, got {len(columns)}")
    for field, column in zip(CATEGORICAL_FIELDS, columns, strict=True):
        if len(column[1]) != n + 1:
            raise ValueError(f"categorical column {field} has {len(column[1]) - 1} values, expected {n}")
    return [value_array(column) for column in columns]


def check_numeric(numeric: np.ndarray) -> np.ndarray:
    """`numeric` as an array, checked to be [N, 13]."""
    arr = np.asarray(numeric)
    if arr.ndim != 2 or arr.shape[1] != N_NUM:
        raise ValueError(f"expected numeric fields of shape [N, {N_NUM}], got {list(arr.shape)}")
    return arr
