"""Checks every request passes before it reaches the model, whichever API it came from: its version, its batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from ctr_contract.repository import MAX_VERSION, parse_version_dir
from serving.errors import InvalidArgument
from serving.requests import DecodedRequest
from serving.signatures import RAW_SIGNATURE, Signature


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


def check_request(request: DecodedRequest, sig: Signature, limits: Limits, unit: str = "instance") -> None:
    """Raise InvalidArgument unless the request's batch is non-empty and within limits; features also finite (N, F).

    Args:
        request: the decoded request; its batch is (N, sig.width) float32 features or a raw batch.
        sig: the served version's signature.
        limits: the server's request limits.
        unit: what one row is called in messages ("instance" for REST, "row" for gRPC tensors).
    """
    batch = request.batch
    if request.signature == RAW_SIGNATURE:
        empty = f"empty batch: no {unit}s for signature '{RAW_SIGNATURE}'; send at least one"
    else:
        shape = cast(np.ndarray, batch).shape
        if len(shape) != 2 or shape[1] != sig.width:
            raise InvalidArgument(
                f"input '{sig.input_name}' has shape {list(shape)}, expected [N, {sig.width}]"
            )
        # The two APIs' wordings, kept as clients have seen them.
        empty = (
            f"empty batch: no instances for input '{sig.input_name}'; send at least one"
            if unit == "instance"
            else f"empty batch: input '{sig.input_name}' has no {unit}s; send at least one"
        )
    n = len(batch)
    if n == 0:
        raise InvalidArgument(empty)
    if n > limits.max_instances:
        raise InvalidArgument(
            f"batch of {n} {unit}s is over the limit of {limits.max_instances} (--max_instances); split it"
        )
    if request.signature != RAW_SIGNATURE and not limits.allow_nonfinite:
        _check_finite(cast(np.ndarray, batch), unit)


def _check_finite(features: np.ndarray, unit: str) -> None:
    finite = np.isfinite(features)
    if not finite.all():
        row, col = (int(i) for i in np.argwhere(~finite)[0])
        raise InvalidArgument(
            f"{unit} {row} feature {col} is {features[row, col]} (not finite in float32); NaN and Inf are "
            "rejected (start the server with --allow_nonfinite to accept them)"
        )
