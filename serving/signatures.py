"""The signatures a served version exposes: keys and tensor names from `ctr_contract`, and their shapes.

Every other serving module takes these from here (not from a codec or a backend), so nothing imports in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctr_contract.signatures import DEFAULT_SIGNATURE, INPUT_NAME, OUTPUT_NAME, RAW_SIGNATURE

__all__ = ["DEFAULT_SIGNATURE", "INPUT_NAME", "OUTPUT_NAME", "RAW_SIGNATURE", "Signature"]


@dataclass(frozen=True)
class Signature:
    """The `serving_default` signature: one float input [-1, width] and one float output [-1, 1]."""

    input_name: str
    output_name: str
    width: int
    output_width: int
    has_raw: bool = False  # the version also serves RAW_SIGNATURE (serving/codecs/raw_codec.py)
