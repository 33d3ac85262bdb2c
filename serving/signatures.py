"""The signatures a served version exposes: keys and tensor names from `ctr_contract`, and their shapes.

Every other serving module takes these from here (not from a codec or a backend), so nothing imports in a cycle.

A version serves one output (`ctr`, every version exported before calibration) or several (`ctr`, then
`raw_score`, the uncalibrated score). A backend returns every output of one call as one float32 array
(N, len(output_names) * output_width), the outputs' columns side by side in `output_names` order, so the
batcher splits one array per request whatever the version; `ctr` is always the first block of columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ctr_contract.signatures import (
    DEFAULT_SIGNATURE,
    INPUT_NAME,
    OUTPUT_NAME,
    RAW_SCORE_NAME,
    RAW_SIGNATURE,
)
from serving.errors import InvalidArgument

__all__ = [
    "DEFAULT_SIGNATURE",
    "INPUT_NAME",
    "OUTPUT_NAME",
    "RAW_SCORE_NAME",
    "RAW_SIGNATURE",
    "Signature",
    "output_order",
]


@dataclass(frozen=True)
class Signature:
    """The `serving_default` signature: one float input [-1, width] and float outputs [-1, output_width] each."""

    input_name: str
    output_name: str  # the score (OUTPUT_NAME): the first block of columns
    width: int
    output_width: int
    has_raw: bool = False  # the version also serves RAW_SIGNATURE (serving/codecs/raw_codec.py)
    extra_outputs: tuple[str, ...] = ()  # served after `output_name`, e.g. (RAW_SCORE_NAME,)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Every output, in the order of the score array's column blocks."""
        return (self.output_name, *self.extra_outputs)

    @property
    def columns(self) -> int:
        """Columns of a backend's score array: every output's `output_width`, side by side."""
        return (1 + len(self.extra_outputs)) * self.output_width

    def output(self, scores: np.ndarray, name: str) -> np.ndarray:
        """Output `name`'s (N, output_width) columns of a backend's scores (a view; `scores` itself when single)."""
        if not self.extra_outputs:
            return scores
        i = self.output_names.index(name) * self.output_width
        return scores[:, i : i + self.output_width]

    def score(self, scores: np.ndarray) -> np.ndarray:
        """The `ctr` columns, C-contiguous (orjson writes no other): what v1 REST answers and what drift,
        metrics and the request log watch. `scores` itself for a one-output version: no copy."""
        return scores if not self.extra_outputs else np.ascontiguousarray(scores[:, : self.output_width])

    def requested(self, names: Iterable[str], field: str) -> tuple[str, ...]:
        """The outputs a request names in `field` (output_filter, outputs), in its order; all when it names none.

        Raises:
            InvalidArgument: a name the version does not serve (each unknown one is named).
        """
        wanted = tuple(dict.fromkeys(names))
        unknown = sorted(set(wanted) - set(self.output_names))
        if unknown:
            if not self.extra_outputs:  # the wording clients of one-output versions have seen
                raise InvalidArgument(f"{field} names {unknown}; the only output is '{self.output_name}'")
            raise InvalidArgument(
                f"{field} names {unknown}; this version's outputs are {list(self.output_names)}"
            )
        return wanted or self.output_names


def output_order(names: Iterable[str]) -> tuple[str, ...] | None:
    """A graph's output names in serving order, `ctr` first and the others as the graph lists them;
    None when there is no `ctr` among them."""
    listed = list(names)
    if OUTPUT_NAME not in listed:
        return None
    return (OUTPUT_NAME, *(n for n in listed if n != OUTPUT_NAME))
