"""Checks every decoded batch passes before it reaches the model, whichever API it came from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.errors import InvalidArgument
from serving.signatures import Signature


@dataclass(frozen=True)
class Limits:
    """Per-request limits: `--max_instances`, `--allow_nonfinite`."""

    max_instances: int
    allow_nonfinite: bool


def check_batch(features: np.ndarray, sig: Signature, limits: Limits, unit: str = "instance") -> None:
    """Raise InvalidArgument unless `features` is a non-empty, finite (N, F) float32 batch within limits.

    Args:
        features: the decoded input, expected (N, sig.width).
        sig: the served version's signature.
        limits: the server's request limits.
        unit: what one row is called in messages ("instance" for REST, "row" for gRPC tensors).
    """
    if features.ndim != 2 or features.shape[1] != sig.width:
        raise InvalidArgument(
            f"input '{sig.input_name}' has shape {list(features.shape)}, expected [N, {sig.width}]"
        )
    n = features.shape[0]
    if n == 0:
        raise InvalidArgument(f"empty batch: input '{sig.input_name}' has no {unit}s; send at least one")
    if n > limits.max_instances:
        raise InvalidArgument(
            f"batch of {n} {unit}s is over the limit of {limits.max_instances} (--max_instances); split it"
        )
    if not limits.allow_nonfinite:
        finite = np.isfinite(features)
        if not finite.all():
            row, col = (int(i) for i in np.argwhere(~finite)[0])
            raise InvalidArgument(
                f"{unit} {row} feature {col} is {features[row, col]} (not finite in float32); NaN and Inf are "
                "rejected (start the server with --allow_nonfinite to accept them)"
            )
