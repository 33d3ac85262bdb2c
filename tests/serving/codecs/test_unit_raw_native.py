"""The native scan of raw REST bodies (serving/codecs/_scan_native.c) against the exact path (orjson, then the
per-value decoder), bit for bit: what it takes decodes the same, what it declines goes the exact path, and no
body that is not valid JSON, or that the exact path refuses, is ever taken."""

from __future__ import annotations

import random
import re
from itertools import pairwise
from typing import Any

import numpy as np
import orjson
import pytest

from ctr_features.compiled import few_rows as raw_one_row
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import DICT_ROWS, RawTransform
from ctr_features.compiled.value_table import EMPTY_KEY
from ctr_features.parity import build_raw_rows
from ctr_features.spec import FeatureSpec
from export.gates.parity import MIN_ROWS
from serving.codecs import raw_body
from serving.codecs.raw_body import client_columns, client_rows
from serving.codecs.rest_codec import decode_predict, decode_raw_body, parse_body, to_request
from serving.errors import InvalidArgument
from tests.serving.codecs import test_unit_raw_decoders as body_tests
from tests.serving.codecs.test_unit_raw_decoders import ROW, SIG, old_path
from tests.serving.codecs.test_unit_raw_fast import fit_spec

MANY = DICT_ROWS + 1  # the numpy transform's batches; up to DICT_ROWS keyed rows are transformed natively
SIZES = (1, 3, DICT_ROWS, MANY, 100, 256)


def assert_same_batch(got: RawBatch | None, want: RawBatch) -> None:
    """The same values bit for bit, and a scanned batch's keys are its values' (bytes as a little-endian
    uint64, eight 0x01 bytes for "": ctr_features/compiled/value_table.py), short values included."""
    assert got is not None
    if not got.keys_known or got.keys is None or got.holds_strings:
        body_tests.assert_same_batch(got, want)
        return
    key = got.keys.key.copy()  # before the values are made from it
    body_tests.assert_same_batch(RawBatch(got.numeric, got.categorical), want)
    values = want.categorical.ravel().tolist()
    expected = [int.from_bytes(v.encode("ascii"), "little") if v else int(EMPTY_KEY) for v in values]
    assert key.ravel().tolist() == expected


def scan(body: bytes) -> Any:
    """The extension's own answer: (n, counts, keys) or None."""
    assert raw_body.scan is not None
    return raw_body.scan(body, 1, raw_body.MAX_SCAN_ROWS)


def scanned(body: bytes) -> RawBatch:
    """The batch decode_raw_body gives for a body the scan takes (asserting that it does)."""
    assert scan(body) is not None, body[:200]
    found = decode_raw_body(body)
    assert found is not None
    batch = found[1]
    assert batch is not None and batch.keys_known and not batch.holds_strings
    return batch


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


def test_the_extension_is_built() -> None:
    """`pip install -e .` (make install) compiles it: a server without it serves through the exact path alone."""
    assert raw_body.NATIVE


def test_gate_rows_scan_as_the_exact_path_decodes_them_and_transform_as_the_feature_spec(
    spec: FeatureSpec,
) -> None:
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    rows = client_rows(numeric, categorical)
    transform = RawTransform(spec.to_dict())
    taken = set()
    for name, group in groups.items():
        for n in SIZES:
            few = slice(group.start, min(group.start + n, group.stop))
            body = orjson.dumps({"instances": rows[few]})
            got = decode_predict(body, SIG)[1].batch
            assert isinstance(got, RawBatch)
            if scan(body) is not None:
                taken.add(name)
            assert_same_batch(got, old_path(body).batch)  # type: ignore[arg-type]
            expected = spec.transform(
                np.where(np.isinf(numeric[few]), np.nan, numeric[few]), categorical[few]
            )
            assert np.array_equal(transform(got), expected), (name, n)
    # Criteo's own values are scanned; 16-digit counts and other strings (the gate's unseen values are over
    # 8 characters) go the exact path
    assert "vocabulary" in taken


def test_unseen_and_missing_criteo_values_scan_as_the_exact_path_decodes_them(spec: FeatureSpec) -> None:
    """Criteo-shaped rows (8 hex characters, unseen ones among them, and missing values): all scanned."""
    rng = np.random.default_rng(3)
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    known = categorical[groups["vocabulary"]]
    unseen = np.array([f"{v:08x}" for v in rng.integers(0, 2**32, known.size)], object).reshape(known.shape)
    mixed = np.where(rng.random(known.shape) < 0.3, unseen, known)
    mixed[rng.random(known.shape) < 0.1] = ""
    rows = client_rows(numeric[groups["vocabulary"]], mixed)
    transform = RawTransform(spec.to_dict())
    for n in SIZES:
        body = orjson.dumps({"instances": rows[:n]})
        batch = scanned(body)
        assert_same_batch(batch, old_path(body).batch)  # type: ignore[arg-type]
        counts = numeric[groups["vocabulary"]][:n]
        assert np.array_equal(transform(batch), spec.transform(counts, mixed[:n]))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (b"3", 3.0),
        (b"-17", -17.0),
        (b"0", 0.0),
        (b"-0", 0.0),  # the integer 0
        (b"-0.0", -0.0),  # the float -0.0
        (b"3.000", 3.0),
        (b"999999999999999", 999999999999999.0),
        (b"-999999999999999.0", -999999999999999.0),
        (b'""', float("nan")),
        (b"null", float("nan")),
    ],
)
def test_counts_the_scan_takes(text: bytes, value: float) -> None:
    body = b'{"instances": [' + b",".join([b'{"I3": ' + text + b', "C1": "68fd1e64"}'] * MANY) + b"]}"
    batch = scanned(body)
    assert np.array([value]).tobytes() == batch.numeric[2, :1].tobytes()
    assert_same_batch(batch, old_path(body).batch)  # type: ignore[arg-type]


def test_spacing_order_signature_and_empty_rows_scan_as_the_exact_path() -> None:
    row = b' {\n\t"C26" : null ,\r "I1":1, "C2": "a b~\x7f", "C3":"" } '
    rows = b",".join([row, b"{}"] * 9)
    for body in (
        b'{"instances":[' + rows + b"]}",
        b' { "signature_name" : "raw" , "instances" : [ ' + rows + b" ] } \n",
        b'{"instances":[' + rows + b'], "signature_name":"raw"}',
    ):
        batch = scanned(body)
        assert_same_batch(batch, old_path(body).batch)  # type: ignore[arg-type]
        assert batch.strings()[len(batch) : len(batch) + 2] == ["a b~\x7f", ""]


BASE = b'{"I1": 3, "I2": -1, "I12": "", "C1": "68fd1e64", "C22": ""}'
DECLINED = [  # each is one row among MANY - 1 plain ones: valid bodies the exact path answers
    b'{"I1": 1e3}',
    b'{"I1": 3.5}',
    b'{"I1": 3.0000000000000001}',
    b'{"I1": 1000000000000000}',  # 16 digits
    b'{"I1": "17"}',
    b'{"I1": true}',
    b'{"I1": 1, "I1": 2}',
    b'{"C1": "68fd1e64a"}',  # 9 characters
    b'{"C1": "\\u0041"}',
    b'{"C1": "h\xc3\xa9llo"}',
    b'{"C1": 5}',
    b'{"\\u0049\\u0031": 5}',
    b'{"I14": 5}',
    b'{"I01": 5}',
    b'{"c1": "x"}',
    b"[1, 2]",
]


@pytest.mark.parametrize("row", DECLINED, ids=range(len(DECLINED)))
def test_rows_outside_the_subset_are_declined_and_answered_as_before(row: bytes) -> None:
    body = b'{"instances": [' + b",".join([BASE] * (MANY - 1) + [row]) + b"]}"
    assert scan(body) is None
    assert_answered_as_before(body)


def assert_answered_as_before(body: bytes) -> None:
    """The server's decoder gives a declined body the exact path's batch, or its message."""
    want = old_columnar(body)
    try:
        got: Any = decode_predict(body, SIG)[1].batch
    except InvalidArgument as exc:
        got = exc.message
    if isinstance(want, str):
        assert got == want
    else:
        body_tests.assert_same_batch(got, want)


@pytest.mark.parametrize(
    "body",
    [
        b'{"instances": [%s], "signature_name": "serving_default"}',
        b'{"instances": [%s], "extra": 1}',
        b'{"instances": [%s], "instances": [%s]}',
        b'{"instances": [%s]} x',
        b'{"instances": [%s],}',
        b'{"instances": [%s,]}',
        b'{"instances": [%s]',
        b'{"instances": {%s}}',
    ],
)
def test_envelopes_outside_the_subset_are_declined(body: bytes) -> None:
    rows = b",".join([BASE] * MANY)
    assert scan(body.replace(b"%s", rows)) is None


def test_a_single_row_is_scanned_and_an_empty_list_left_to_the_exact_path() -> None:
    body = b'{"instances": [' + BASE + b"]}"
    assert len(scanned(body)) == 1
    assert scan(b'{"instances": []}') is None


@pytest.mark.parametrize(
    "body",
    [
        {"instances": [ROW, {"I3": 0, "C2": None, "C3": "abc"}] * 10},
        {
            "inputs": {
                "I1": [3, None, -1],
                "I12": ["", 5, 0],
                "C1": ["68fd1e64", None, ""],
                "C3": ["abc", "", "x"],
            }
        },
    ],
    ids=["rows", "columns"],
)
def test_no_mutation_of_a_body_is_taken_unless_the_exact_path_decodes_it_alike(body: dict[str, Any]) -> None:
    """Random byte edits of a valid body: whatever the scan takes, the exact path decodes to the same batch."""
    rng = random.Random(5)
    data0 = orjson.dumps(body)
    alphabet = b' {}[]",:-.0123456789eE\\nulltrAICx\x00\x01\x7f\xc3\n'
    taken = declined = 0
    for _ in range(3000):
        data = bytearray(data0)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            kind = rng.random()
            if kind < 0.4:
                data[at] = rng.choice(alphabet)
            elif kind < 0.7:
                data.insert(at, rng.choice(alphabet))
            elif kind < 0.95:
                del data[at]
            else:
                del data[at:]
        mutated = bytes(data)
        if scan(mutated) is None:
            declined += 1
            continue
        taken += 1
        want = old_columnar(mutated)
        assert not isinstance(want, str), (mutated, want)  # never a body the exact path refuses
        assert_same_batch(decode_predict(mutated, SIG)[1].batch, want)  # type: ignore[arg-type]
    assert taken > 100 and declined > 1000  # both sides of the subset were tried


def test_scanned_batches_merge_keyed_and_transform_alike(spec: FeatureSpec) -> None:
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    rows = client_rows(numeric, categorical)[groups["vocabulary"]]
    transform = RawTransform(spec.to_dict())
    starts = np.cumsum((0, MANY, 40, 100))
    parts = [scanned(orjson.dumps({"instances": rows[a:b]})) for a, b in pairwise(starts)]
    merged = RawBatch.concat(parts)  # type: ignore[arg-type]
    assert not merged.holds_strings and merged.keys is not None and merged.keys.slow is None
    arrays = RawBatch(
        np.concatenate([p.numeric for p in parts], 1), np.concatenate([p.categorical for p in parts], 1)
    )
    assert_same_batch(merged, arrays)
    assert np.array_equal(transform(merged), transform(arrays))


def test_few_keyed_rows_transform_natively_as_the_feature_spec_before_and_after_the_cache_fills(
    spec: FeatureSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to DICT_ROWS keyed rows: the first sight of a count goes to numpy (and fills the z-score cache), the
    next ones natively; both equal FeatureSpec.transform, and leave the numpy path's entries for drift."""
    native, rows_of = [], raw_one_row._native_rows
    assert rows_of is not None

    def counted(*args: Any) -> Any:
        found = rows_of(*args)
        native.append(found is not None)
        return found

    monkeypatch.setattr(raw_one_row, "_native_rows", counted)
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    rows = client_rows(numeric, categorical)
    vocabulary = groups["vocabulary"]
    transform, reference = RawTransform(spec.to_dict()), RawTransform(spec.to_dict())
    for n in (1, 2, 5, DICT_ROWS):
        for start in (vocabulary.start, vocabulary.start):  # the second time every count is cached
            few = slice(start, start + n)
            batch = scanned(orjson.dumps({"instances": rows[few]}))
            expected = spec.transform(numeric[few], categorical[few])
            assert np.array_equal(transform(batch), expected), n
            owner, entries = batch.entries()  # type: ignore[misc]
            assert owner is transform
            assert np.array_equal(entries, reference.entries(RawBatch(batch.numeric, batch.categorical)))
    assert True in native and False in native  # both the native path and the numpy fallback ran


def test_the_native_table_and_rows_refuse_inconsistent_arrays() -> None:
    table, rows = raw_one_row._native_table, raw_one_row._native_rows
    assert table is not None and rows is not None
    key, code, salts = np.zeros(16, np.uint64), np.zeros(16, np.int32), np.zeros(26, np.uint64)
    lift, column = np.zeros(2, np.float32), np.full(2, 100, np.int32)
    good = (key.tobytes(), code.tobytes(), salts.tobytes(), 60, 0, lift.tobytes(), column.tobytes(), 128)
    built = table(*good)
    for at, bad, message in [
        (0, key[:8].tobytes(), "2**(64 - shift)"),
        (1, code[:8].tobytes(), "one int32 code per slot"),
        (2, salts[:3].tobytes(), "one uint64 salt"),
        (4, 7, "the default is not an entry"),
        (6, np.full(2, 3, np.int32).tobytes(), "not a bucket column"),
        (1, np.full(16, 9, np.int32).tobytes(), "a code is not an entry"),
    ]:
        args = list(good)
        args[at] = bad
        with pytest.raises(ValueError, match=re.escape(message)):
            table(*args)
    counts, keys = np.zeros((13, 2)), np.zeros((26, 2), np.uint64)
    with pytest.raises(ValueError, match="13, 13 and 26 values per row"):
        rows(built, [0.0] * 26, counts, keys[:, :1].copy(), 2)
    with pytest.raises(ValueError, match="invalid PyCapsule"):
        rows(b"not a table", [0.0] * 26, counts, keys, 2)
    features, entries = rows(built, [0.5] * 26, counts, keys, 2)
    out = np.frombuffer(features, np.float32).reshape(2, 128)
    assert out[:, :13].tolist() == [[0.5] * 13] * 2 and out[:, 100].tolist() == [26.0, 26.0]
    assert np.frombuffer(entries, np.int32).tolist() == [0] * 52


def old_columnar(body: bytes) -> Any:
    """The exact path's answer to a body (row format or columnar): its batch, or its message."""
    try:
        request = to_request(parse_body(body), SIG)
    except InvalidArgument as exc:
        return exc.message
    return request.batch


def test_columnar_gate_rows_scan_as_the_exact_path_decodes_them(spec: FeatureSpec) -> None:
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    transform = RawTransform(spec.to_dict())
    taken = set()
    for name, group in groups.items():
        for n in SIZES:
            few = slice(group.start, min(group.start + n, group.stop))
            for signature in ({}, {"signature_name": "raw"}):
                body = orjson.dumps({"inputs": client_columns(numeric[few], categorical[few]), **signature})
                columnar, request = decode_predict(body, SIG)
                assert columnar is True and isinstance(request.batch, RawBatch)
                if scan(body) is not None:
                    taken.add(name)
                assert_same_batch(request.batch, old_columnar(body))
                counts = np.where(np.isinf(numeric[few]), np.nan, numeric[few])
                assert np.array_equal(transform(request.batch), spec.transform(counts, categorical[few]))
    assert "vocabulary" in taken and "all_missing" in taken


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": {"I1": [1, 2], "C1": ["a"]}}',  # lengths differ
        b'{"inputs": {"I1": [1], "I1": [2]}}',
        b'{"inputs": {"I1": [1], "features": [2]}}',
        b'{"inputs": {"I1": 1}}',
        b'{"inputs": {"I1": [[1]]}}',
        b'{"inputs": {"I1": [1.5]}}',
        b'{"inputs": {}}',
        b'{"inputs": {"I1": []}}',
        b'{"inputs": {"C1": ["x"]}, "instances": [{"I1": 1}]}',
        b'{"instances": [{"I1": 1}], "inputs": {"C1": ["x"]}}',
        b'{"inputs": [[1, 2]]}',
        b'{"inputs": {"features": [[1, 2]]}}',
    ],
)
def test_columnar_bodies_outside_the_subset_are_declined_and_answered_as_before(body: bytes) -> None:
    assert scan(body) is None
    assert_answered_as_before(body)


def test_the_scan_declines_more_rows_than_its_bound() -> None:
    assert raw_body.scan is not None
    rows = b'{"instances": [' + b",".join([BASE] * 11) + b"]}"
    columns = b'{"inputs": {"I1": [' + b",".join([b"1"] * 11) + b"]}}"
    for body in (rows, columns):
        assert raw_body.scan(body, 1, 11) is not None
        assert raw_body.scan(body, 1, 10) is None
