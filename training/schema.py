"""The Criteo record layout; it lives in `ctr_contract.schema` (this module only re-exports it)."""

from __future__ import annotations

from ctr_contract.schema import CATEGORICAL_FIELDS, FIELDS, LABEL, N_FIELDS, NUMERIC_FIELDS

__all__ = ["CATEGORICAL_FIELDS", "FIELDS", "LABEL", "NUMERIC_FIELDS", "N_FIELDS"]
