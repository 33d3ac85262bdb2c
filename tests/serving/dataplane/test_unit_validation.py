"""serving/dataplane/validation.py's limits and the predictor's `check_request` without a server: the one check
every decoded request passes, exact messages."""

from __future__ import annotations

import numpy as np
import pytest

from ctr_contract.signatures import DEFAULT_WIDTH
from serving.codecs.raw_codec import decode_rest
from serving.dataplane.predictor import check_request
from serving.dataplane.validation import Limits
from serving.errors import InvalidArgument
from serving.requests import DecodedRequest
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature

SIG = Signature("features", "ctr", DEFAULT_WIDTH, 1, has_raw=True)
LIMITS = Limits(max_instances=4, allow_nonfinite=False)
NONFINITE_HINT = "NaN and Inf are rejected (start the server with --allow_nonfinite to accept them)"


def features(n: int, width: int = DEFAULT_WIDTH) -> DecodedRequest:
    return DecodedRequest(DEFAULT_SIGNATURE, np.full((n, width), 0.5, np.float32))


def error_of(request: DecodedRequest, unit: str = "instance", limits: Limits = LIMITS) -> str:
    with pytest.raises(InvalidArgument) as caught:
        check_request(request, SIG, limits, unit)
    return caught.value.message


def test_a_batch_within_limits_passes() -> None:
    check_request(features(4), SIG, LIMITS)
    check_request(DecodedRequest(RAW_SIGNATURE, decode_rest([{}] * 4, False)), SIG, LIMITS)


@pytest.mark.parametrize(
    ("request_", "unit", "message"),
    [
        (features(0), "instance", "empty batch: no instances for input 'features'; send at least one"),
        (features(0), "row", "empty batch: input 'features' has no rows; send at least one"),
        (
            DecodedRequest(RAW_SIGNATURE, decode_rest([], False)),
            "instance",
            "empty batch: no instances for signature 'raw'; send at least one",
        ),
        (
            DecodedRequest(RAW_SIGNATURE, decode_rest({}, True)),
            "row",
            "empty batch: no rows for signature 'raw'; send at least one",
        ),
        (features(5), "instance", "batch of 5 instances is over the limit of 4 (--max_instances); split it"),
        (
            DecodedRequest(RAW_SIGNATURE, decode_rest([{}] * 5, False)),
            "row",
            "batch of 5 rows is over the limit of 4 (--max_instances); split it",
        ),
        (
            features(2, DEFAULT_WIDTH - 1),
            "row",
            f"input 'features' has shape [2, {DEFAULT_WIDTH - 1}], expected [N, {DEFAULT_WIDTH}]",
        ),
        (
            DecodedRequest(DEFAULT_SIGNATURE, np.zeros(3, np.float32)),
            "row",
            f"input 'features' has shape [3], expected [N, {DEFAULT_WIDTH}]",
        ),
    ],
    ids=[
        "empty-rest",
        "empty-grpc",
        "empty-raw-rest",
        "empty-raw-grpc",
        "over-limit",
        "raw-over-limit",
        "narrow",
        "one-dimensional",
    ],
)
def test_bad_batches_are_named_once_with_the_fix(request_: DecodedRequest, unit: str, message: str) -> None:
    assert error_of(request_, unit) == message


def test_the_shape_is_checked_before_emptiness() -> None:
    assert (
        error_of(features(0, 3), "row") == f"input 'features' has shape [0, 3], expected [N, {DEFAULT_WIDTH}]"
    )


def test_the_first_non_finite_value_is_named_by_row_and_feature() -> None:
    request = features(3)
    request.batch[1, 7], request.batch[2, 0] = np.inf, np.nan
    assert error_of(request) == f"instance 1 feature 7 is inf (not finite in float32); {NONFINITE_HINT}"
    assert error_of(request, "row").startswith("row 1 feature 7 is inf")


def test_allow_nonfinite_lets_nan_through() -> None:
    request = features(1)
    request.batch[0, 0] = np.nan
    check_request(request, SIG, Limits(max_instances=4, allow_nonfinite=True))


def test_raw_batches_are_not_checked_for_nan_which_means_missing() -> None:
    check_request(DecodedRequest(RAW_SIGNATURE, decode_rest([{"I1": None}], False)), SIG, LIMITS)
