"""The Criteo record: a 0/1 label, 13 integer counts I1..I13 and 26 hashed categoricals C1..C26.

In a data file every field may be an empty cell (missing). Counts are integers (Criteo has -1 and values over
1e6); categoricals are strings, in Criteo 8 lowercase hex digits such as `68fd1e64`.
"""

from __future__ import annotations

LABEL = "label"
NUMERIC_FIELDS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))  # integer counts
CATEGORICAL_FIELDS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))  # strings
FIELDS: tuple[str, ...] = (LABEL, *NUMERIC_FIELDS, *CATEGORICAL_FIELDS)  # the column order of a data file
N_FIELDS = len(FIELDS)  # 40
RAW_FIELDS: tuple[str, ...] = (*NUMERIC_FIELDS, *CATEGORICAL_FIELDS)  # what a raw request row carries (39)
