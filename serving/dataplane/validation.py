"""What every API checks of a request the same way: the version a client names, and the request limits.

The batch itself is checked where it is run, by the predictor (serving/dataplane/predictor.py, `check_request`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ctr_contract.repository import MAX_VERSION, parse_version_dir
from serving.errors import InvalidArgument


@dataclass(frozen=True)
class Limits:
    """Per-request limits: `--max_instances`, `--allow_nonfinite`."""

    max_instances: int
    allow_nonfinite: bool


def parse_version(text: str | None) -> int | None:
    """A version a client names (in a URL or a request field): None for none, else the version-folder rule.

    InvalidArgument (400) for anything but 1..2**63-1 without leading zeros; no int() of 5,000 digits is tried.
    """
    if text is None:
        return None
    version = parse_version_dir(text)
    if version is None:
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        if not (text.isascii() and text.isdigit()):  # int() rejects some Unicode digits, e.g. '²'
            raise InvalidArgument(f"version must be a positive integer, got '{shown}'")
        raise InvalidArgument(
            f"version must be an integer from 1 to {MAX_VERSION} without leading zeros, got '{shown}'"
        )
    return version
