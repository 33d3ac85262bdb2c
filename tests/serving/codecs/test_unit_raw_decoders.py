"""The two decoders of a raw REST body, against each other: the native scan (the one fast path,
serving/codecs/raw_body.py) and the exact path (orjson, then serving/codecs/raw_codec.py). On every row kind of
export's raw parity gate, in row and columnar format, a body the scan takes gives the exact path's RawBatch
bit for bit, and the same features through the compiled FeatureSpec, equal to `FeatureSpec.transform`; a
body it declines gets the exact path's batch or message. Without the scan the exact path serves alone."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import orjson
import pytest

from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import DICT_ROWS, RawTransform
from ctr_features.parity import build_raw_rows
from ctr_features.spec import FeatureSpec
from export.gates.parity import MIN_ROWS
from serving.codecs import raw_body
from serving.codecs.raw_body import client_columns, client_rows
from serving.codecs.raw_codec import MAX_COUNT
from serving.codecs.rest_codec import decode_predict, decode_raw_body, parse_body, to_request
from serving.errors import InvalidArgument
from serving.requests import DecodedRequest
from serving.signatures import RAW_SIGNATURE, Signature
from tests.serving.codecs.test_unit_raw_fast import fit_spec

SIG = Signature("features", "ctr", 128, 1, has_raw=True)
BATCH_SIZES = (1, 3, DICT_ROWS, DICT_ROWS + 1, 100, 256)
pytestmark = pytest.mark.skipif(not raw_body.NATIVE, reason="the native scan is not built")


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


def old_path(body: bytes) -> DecodedRequest:
    """The exact path's request for a body."""
    return to_request(parse_body(body), SIG)


def assert_same_batch(got: RawBatch, want: RawBatch) -> None:
    """The same values bit for bit (NaN, -0.0 and all), and the same keys."""
    assert got.numeric.dtype == want.numeric.dtype == np.float64
    assert got.numeric.tobytes() == want.numeric.tobytes()
    assert got.categorical.dtype == want.categorical.dtype == object
    assert got.categorical.tolist() == want.categorical.tolist()
    assert (got.keys is None) == (want.keys is None)
    if got.keys is not None and want.keys is not None:
        assert np.array_equal(got.keys.key, want.keys.key)
        assert (got.keys.slow is None) == (want.keys.slow is None)


@pytest.mark.parametrize("columnar", [False, True], ids=["rows", "columns"])
def test_gate_row_kinds_decode_alike_on_both_paths_and_transform_as_the_feature_spec(
    spec: FeatureSpec, columnar: bool
) -> None:
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    assert set(groups) == {"vocabulary", "unseen", "all_missing", "extreme_counts", "odd_strings", "random"}
    fast_transform, exact_transform = RawTransform(spec.to_dict()), RawTransform(spec.to_dict())
    taken = set()
    for name, group in groups.items():
        for n in BATCH_SIZES:
            few = slice(group.start, min(group.start + n, group.stop))
            counts = numeric[few]
            if not raw_body.json_can_carry(counts):
                counts = np.where(np.isinf(counts), np.nan, counts)  # as a client sends them: absent
            if columnar:
                body = orjson.dumps({"inputs": client_columns(counts, categorical[few])})
            else:
                body = orjson.dumps({"instances": client_rows(counts, categorical[few])})
            exact = old_path(body)
            assert exact.signature == RAW_SIGNATURE and isinstance(exact.batch, RawBatch)
            found = decode_raw_body(body)
            served = decode_predict(body, SIG)
            assert served[0] is columnar and isinstance(served[1].batch, RawBatch)
            expected = spec.transform(counts, categorical[few])
            if found is not None:
                taken.add(name)
                assert found[0] is columnar
                assert_same_batch(found[1], exact.batch)
            assert_same_batch(served[1].batch, exact.batch)
            for _ in range(2):  # the second time from the few-row z-score cache
                fast = fast_transform(served[1].batch)
                assert fast.tobytes() == exact_transform(exact.batch).tobytes() == expected.tobytes(), (
                    name,
                    n,
                )
    # Criteo-shaped values are scanned (the gate's other unseen values are over 8 characters, its extreme
    # counts over 15 digits, its odd strings not plain ASCII: the exact path's)
    assert {"vocabulary", "all_missing", "unseen", "random"} <= taken


ROW = {"I1": 3, "I2": -1, "I12": "", "C1": "68fd1e64", "C22": ""}


@pytest.mark.parametrize(
    "body",
    [
        {"instances": [ROW] * 20},
        {"instances": [ROW] * 20, "signature_name": "raw"},
        {"signature_name": "raw", "instances": [{}]},
        {"instances": [{"I1": 3.0, "I2": -0.0, "I3": 1e14, "I4": 999999999999999}] * 17},
        {"instances": [{"C1": None, "C2": "68fd1e64"}] * 3},
        {"inputs": {"I1": [3, None, ""], "C1": ["68fd1e64", None, ""]}},
    ],
    ids=["plain", "signature-raw", "empty-row", "integral-floats", "null-few", "columns"],
)
def test_bodies_the_fast_path_takes_decode_as_the_exact_path(body: dict[str, Any]) -> None:
    data = orjson.dumps(body)
    found = decode_raw_body(data)
    assert found is not None and found[0] is ("inputs" in body)
    assert_same_batch(found[1], old_path(data).batch)  # type: ignore[arg-type]


# Bodies the fast path leaves to the exact path: served (numeric strings, ±2**53, long or non-ASCII strings,
# escapes, exponents, repeated keys, ignored envelope keys) or a 400 with the exact path's message.
DECLINED = [
    b'{"instances": [{"I1": "17", "I2": " -4 "}]}',
    b'{"instances": [{"I1": 9007199254740992, "I2": -9007199254740992}]}',
    b'{"instances": [{"I1": 9007199254740992.0}]}',
    b'{"instances": [{"I1": 1e15, "I2": 1E3, "I3": 3.00000000000000001}]}',
    b'{"instances": [{"I4": 1, "I4": 2}]}',
    b'{"instances": [{"C1": "h\xc3\xa9llo", "C2": "\xe6\x97\xa5\xe6\x9c\xac", "C3": "aaaaaaaaaaaa", "C5": "\\t"}]}',
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
    b'{"inputs": {"I1": [1, 2], "C1": ["a"]}}',
    b'{"inputs": {"I1": ["7", 2], "C1": ["a\\u0041", null]}}',
    b'{"instances": [{"I1": 1}',
    b'{"instances": {"I1": 1}}',
    b"[1]",
]


def exact_answer(body: bytes, decode: Any) -> DecodedRequest | str:
    try:
        return decode(body)
    except InvalidArgument as exc:
        return exc.message


def assert_answered_alike(got: DecodedRequest | str, want: DecodedRequest | str) -> None:
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, DecodedRequest) and got.signature == want.signature
        if isinstance(want.batch, RawBatch):
            assert_same_batch(got.batch, want.batch)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", DECLINED, ids=range(len(DECLINED)))
def test_bodies_the_fast_path_declines_get_the_exact_paths_answer(body: bytes) -> None:
    assert decode_raw_body(body) is None
    got = exact_answer(body, lambda b: decode_predict(b, SIG)[1])
    assert_answered_alike(got, exact_answer(body, old_path))


@pytest.mark.parametrize("body", [*DECLINED[:8], orjson.dumps({"instances": [ROW] * 20})], ids=range(9))
def test_without_the_scan_the_exact_path_serves_alone(body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    want = exact_answer(body, lambda b: decode_predict(b, SIG)[1])
    monkeypatch.setattr(raw_body, "scan", None)
    assert decode_raw_body(body) is None
    assert_answered_alike(exact_answer(body, lambda b: decode_predict(b, SIG)[1]), want)


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


def test_batches_of_both_paths_merge_as_their_object_arrays_do_and_transform_alike(spec: FeatureSpec) -> None:
    """Scanned batches hold keys only, the exact path's arrays: merged by the batcher, in any mix, they give
    the object array, keys and features of the merged arrays."""
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    rows = client_rows(numeric, categorical)[groups["vocabulary"]]
    transform = RawTransform(spec.to_dict())
    for sizes in ((1, 1), (1, 3, 2), (DICT_ROWS + 1, 1), (40, 60, 100)):
        starts = np.cumsum((0, *sizes))
        bodies = [orjson.dumps({"instances": rows[a:b]}) for a, b in pairwise(starts)]
        for k in range(2):  # all scanned; then every other part from the exact path
            parts: list[RawBatch] = [
                old_path(b).batch if k and i % 2 else decode_raw_body(b)[1]  # type: ignore[index,misc]
                for i, b in enumerate(bodies)
            ]
            merged = RawBatch.concat(parts)
            arrays = RawBatch(
                np.concatenate([p.numeric for p in parts], 1),
                np.concatenate([p.categorical for p in parts], 1),
            )
            assert_same_batch(merged, arrays)
            assert np.array_equal(transform(merged), transform(arrays)), sizes


def test_counts_at_the_bounds_are_the_exact_paths() -> None:
    body = orjson.dumps({"instances": [{"I1": MAX_COUNT, "I2": -MAX_COUNT}]})
    assert decode_raw_body(body) is None
    batch = decode_predict(body, SIG)[1].batch
    assert isinstance(batch, RawBatch) and batch.numeric[:2, 0].tolist() == [MAX_COUNT, -MAX_COUNT]
