"""The msgspec fast path of raw REST bodies (codecs/raw_body.py) against the path it stands in for: orjson then
the per-value decoder (`parse_body` + `to_request`), bit for bit, and `FeatureSpec.transform` on the result."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import orjson
import pytest

from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import DICT_ROWS, RawTransform
from ctr_features.spec import FeatureSpec
from export.gates.parity import MIN_ROWS
from export.gates.raw_parity import build_raw_rows
from serving.codecs.raw_body import client_rows, decode_raw_instances
from serving.codecs.raw_codec import MAX_COUNT
from serving.codecs.rest_codec import decode_predict, parse_body, to_request
from serving.errors import InvalidArgument
from serving.requests import DecodedRequest
from serving.signatures import RAW_SIGNATURE, Signature
from tests.serving.unit.test_unit_raw_fast import fit_spec

SIG = Signature("features", "ctr", 128, 1, has_raw=True)
BATCH_SIZES = (1, 3, DICT_ROWS, DICT_ROWS + 1, 100, 200)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


def old_path(body: bytes) -> DecodedRequest:
    return to_request(parse_body(body), SIG)


def assert_same_batch(got: RawBatch, want: RawBatch) -> None:
    assert got.numeric.dtype == want.numeric.dtype == np.float64
    assert got.numeric.tobytes() == want.numeric.tobytes()  # bit for bit: NaN, -0.0 and all
    assert got.categorical.dtype == want.categorical.dtype == object
    assert got.categorical.tolist() == want.categorical.tolist()
    if len(got) > DICT_ROWS:  # the keys the decoder made equal those the transform would make
        assert (got.keys is None) == (want.keys is None)
        if got.keys is not None and want.keys is not None:
            assert np.array_equal(got.keys.key, want.keys.key)
            assert (got.keys.slow is None) == (want.keys.slow is None)


def test_gate_rows_decode_bit_for_bit_as_the_exact_path_and_transform_as_the_feature_spec(
    spec: FeatureSpec,
) -> None:
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    assert set(groups) == {"vocabulary", "unseen", "all_missing", "extreme_counts", "odd_strings", "random"}
    rows = client_rows(numeric, categorical)
    transform = RawTransform(spec.to_dict())
    for name, group in groups.items():
        for n in BATCH_SIZES:
            few = slice(group.start, min(group.start + n, group.stop))
            body = orjson.dumps({"instances": rows[few]})
            want = old_path(body)
            columnar, got = decode_predict(body, SIG)
            assert columnar is False and isinstance(got.batch, RawBatch), (name, n)
            assert got.signature == want.signature == RAW_SIGNATURE
            assert_same_batch(got.batch, want.batch)  # type: ignore[arg-type]
            # ±2**53 exactly is the exact path's (the int may have rounded onto it); all else is fast
            fast = decode_raw_instances(body)
            assert (fast is None) == bool((np.abs(numeric[few]) == 2.0**53).any()), (name, n)
            expected = spec.transform(
                np.where(np.isinf(numeric[few]), np.nan, numeric[few]), categorical[few]
            )
            assert np.array_equal(transform(got.batch), expected), (name, n)  # type: ignore[arg-type]


ROW = {"I1": 3, "I2": -1, "I12": "", "C1": "68fd1e64", "C22": ""}


@pytest.mark.parametrize(
    "body",
    [
        {"instances": [ROW] * 20},
        {"instances": [ROW] * 20, "signature_name": "raw"},
        {"signature_name": "raw", "instances": [{}]},
        {
            "instances": [{"I1": 3.0, "I2": -0.0, "I3": 1e15, "I4": MAX_COUNT - 1, "I5": -(MAX_COUNT - 1)}]
            * 17
        },
        {"instances": [{"C1": None, "C2": "héllo", "C3": "日本語", "C4": "a" * 300, "C5": "\t"}] * 17},
        {"instances": [{"C1": None, "C2": "68fd1e64"}] * 3},
    ],
    ids=["plain", "signature-raw", "empty-row", "integral-floats", "odd-strings", "null-few"],
)
def test_bodies_the_fast_path_takes_decode_as_the_exact_path(body: dict[str, Any]) -> None:
    data = orjson.dumps(body)
    fast = decode_raw_instances(data)
    assert fast is not None
    assert_same_batch(fast, old_path(data).batch)  # type: ignore[arg-type]


def test_json_spacing_float_spellings_and_repeated_keys_decode_as_the_exact_path() -> None:
    data = b'{ "instances" : [ { "I1" : 3.00000000000000001 , "I2" : 1E3, "I3": -0, "C1" : "x", "I4": 1, "I4": 2 } ] }'
    fast = decode_raw_instances(data)
    assert fast is not None and fast.numeric[:4, 0].tolist() == [3.0, 1000.0, 0.0, 2.0]  # the last I4 wins
    assert_same_batch(fast, old_path(data).batch)  # type: ignore[arg-type]


# Bodies the fast path leaves to the exact path: served (numeric strings, ±2**53, ignored envelope keys) or a
# 400 with the exact path's message, whichever the exact path gives.
DECLINED = [
    b'{"instances": [{"I1": "17", "I2": " -4 "}]}',
    b'{"instances": [{"I1": 9007199254740992, "I2": -9007199254740992}]}',
    b'{"instances": [{"I1": 9007199254740992.0}]}',
    b'{"instances": [{"I1": 1}], "extra": 1}',
    b'{"instances": [{"I1": 1, "C1": "\\ud800"}]}',
    b'{"instances": [{"I1": true}]}',
    b'{"instances": [{"I1": 1.5}]}',
    b'{"instances": [{"I1": 9007199254740993}]}',
    b'{"instances": [{"I1": 100000000000000000000000000000000000000000}]}',
    b'{"instances": [{"I1": 1e400}]}',
    b'{"instances": [{"I1": NaN}]}',
    b'{"instances": [{"I1": [1]}]}',
    b'{"instances": [{"C1": 5}]}',
    b'{"instances": [{"I14": 1}]}',
    b'{"instances": [{"I1": 1}, [1, 2]]}',
    b'{"instances": []}',
    b'{"instances": [{"I1": 1}], "signature_name": "serving_default"}',
    b'{"instances": [{"I1": 1}], "signature_name": null}',
    b'{"instances": [{"I1": 1}], "inputs": {"I1": [1]}}',
    b'{"inputs": {"I1": [1, 2], "C1": ["a", null]}}',
    b'{"instances": [{"I1": 1}',
    b'{"instances": {"I1": 1}}',
    b"[1]",
]


@pytest.mark.parametrize("body", DECLINED, ids=range(len(DECLINED)))
def test_bodies_the_fast_path_declines_get_the_exact_paths_answer(body: bytes) -> None:
    assert decode_raw_instances(body) is None
    try:
        want: DecodedRequest | str = old_path(body)
    except InvalidArgument as exc:
        want = exc.message
    try:
        got: DecodedRequest | str = decode_predict(body, SIG)[1]
    except InvalidArgument as exc:
        got = exc.message
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, DecodedRequest) and got.signature == want.signature
        if isinstance(want.batch, RawBatch):
            assert_same_batch(got.batch, want.batch)  # type: ignore[arg-type]


def test_a_version_without_raw_never_takes_the_fast_path() -> None:
    features = Signature("features", "ctr", 128, 1)
    with pytest.raises(InvalidArgument) as caught:
        decode_predict(orjson.dumps({"instances": [ROW]}), features)
    assert caught.value.message == (
        'Serving signature name: "raw" not found in signature def; this version was exported before raw '
        "serving: send 'features' or re-export it"
    )


def test_vectors_still_decode_as_features() -> None:
    columnar, request = decode_predict(orjson.dumps({"instances": [[0.5] * 128] * 3}), SIG)
    assert columnar is False and request.signature != RAW_SIGNATURE
    assert request.batch.shape == (3, 128)  # type: ignore[union-attr]


def test_decoded_batches_merge_as_their_object_arrays_do_and_transform_alike(spec: FeatureSpec) -> None:
    """The decoder's batches keep their values as a list (RawBatch.of_strings): merged by the batcher they give
    the object array, keys and features of the merged arrays."""
    (numeric, categorical), _ = build_raw_rows(spec, MIN_ROWS, None)
    rows = client_rows(numeric, categorical)
    transform = RawTransform(spec.to_dict())
    for sizes in ((1, 1), (1, 3, 2), (DICT_ROWS + 1, 1), (40, 60, 100)):
        starts = np.cumsum((0, *sizes))
        parts = [decode_raw_instances(orjson.dumps({"instances": rows[a:b]})) for a, b in pairwise(starts)]
        assert all(p is not None and not p.holds_array for p in parts)  # no object array made
        merged = RawBatch.concat(parts)  # type: ignore[arg-type]
        arrays = RawBatch(
            np.concatenate([p.numeric for p in parts], 1),  # type: ignore[union-attr]
            np.concatenate([p.categorical for p in parts], 1),
        )  # type: ignore[union-attr]
        assert merged.strings() == arrays.categorical.ravel().tolist()
        assert_same_batch(merged, arrays)
        assert np.array_equal(transform(merged), transform(arrays)), sizes
