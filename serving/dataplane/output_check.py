"""No NaN or infinite score ever leaves the server: a model output that is not finite fails the request.

A finite input can still overflow the model (a row of 3e38 floats turns into NaN inside the first layer), and a
silent NaN prediction is worse than an error: a caller that ranks or bids on it fails far from the cause. The
request answers `NonFiniteOutput` (500 / INTERNAL: the model failed on an input the API accepted, so it is the
server's fault, not the client's), naming the first instance, and `ctr_serving_nonfinite_outputs_total` counts
the withheld instances so an alert (deploy's CtrServingNonFiniteOutputs) pages the model owner. Unless the
inputs of those instances lie far outside the ranges seen in training (serving/runtime/input_range.py): then
the client sent an absurd input, and the answer is a 400 naming it, not counted as the model's failure.
"""

from __future__ import annotations

import numpy as np

from serving.errors import NonFiniteOutput
from serving.observability.metrics import ServingMetrics
from serving.runtime.input_range import FeatureRanges


def check_outputs(
    scores: np.ndarray,
    metrics: ServingMetrics,
    model_name: str,
    unit: str = "instance",
    features: np.ndarray | None = None,
    ranges: FeatureRanges | None = None,
) -> None:
    """Raise NonFiniteOutput naming the first instance whose (N, K) scores are not all finite; count them.

    With the request's (N, F) `features` and the version's training `ranges`, non-finite outputs whose inputs
    all lie far outside those ranges raise InvalidArgument instead (serving/runtime/input_range.py), uncounted:
    the client's input, not the model, is at fault. Neither is looked at while every score is finite.
    """
    finite = np.isfinite(scores)
    if finite.all():
        return
    bad_rows = ~finite.reshape(len(scores), -1).all(axis=1)
    if ranges is not None and features is not None:
        error = ranges.explain(features, bad_rows, scores, unit)
        if error is not None:
            raise error
    metrics.nonfinite_outputs.inc(model_name, amount=float(bad_rows.sum()))
    row = int(np.argmax(bad_rows))
    value = scores.reshape(len(scores), -1)[row][~finite.reshape(len(scores), -1)[row]][0]
    raise NonFiniteOutput(
        f"the model's output for {unit} {row} is {value} (not finite; {int(bad_rows.sum())} of {len(scores)} "
        f"{unit}s), so no prediction is returned; {unit} {row} is outside what the model handles (e.g. "
        "features near the float32 limit): scale its features into the range the model was trained on"
    )
