"""The Criteo record layout: label, 13 integer counts I1–I13, 26 hashed categoricals C1–C26."""

from __future__ import annotations

LABEL = "label"
NUMERIC_FIELDS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL_FIELDS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
FIELDS: tuple[str, ...] = (LABEL, *NUMERIC_FIELDS, *CATEGORICAL_FIELDS)
N_FIELDS = len(FIELDS)  # 40
