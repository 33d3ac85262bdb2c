"""Drift bins raw rows from the entries the compiled FeatureSpec found for them (RawBatch.remember_entries):
the same codes as looking every value up in the reference's bins, on every gate row kind and batch size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import DICT_ROWS, RawTransform
from ctr_features.parity import build_raw_rows
from ctr_features.spec import FeatureSpec
from export.gates.parity import MIN_ROWS
from export.publish.drift_reference import raw_bins
from serving.observability.drift import FLUSH_REQUESTS, DriftMonitor, Reference
from serving.signatures import RAW_SIGNATURE
from tests.serving.codecs.test_unit_raw_fast import fit_spec
from training.synth import sample_rows


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


def training_rows() -> tuple[np.ndarray, np.ndarray]:
    """Rows drawn as `fit_spec`'s (its seed): the reference's bins, as export takes them, are of such rows."""
    numeric, ranks = sample_rows(np.random.default_rng(5), 3_000)
    categorical = np.char.mod("%08x", ranks % 40).astype(object)
    categorical[ranks < 0] = ""
    return numeric, categorical


def reference_of(numeric: np.ndarray, categorical: np.ndarray) -> Reference:
    """A reference whose raw bins come from these rows (the features and score parts are placeholders): each
    field's 10 most frequent values, which the spec fitted on such rows holds (its 20th may be under the
    spec's min_count: drift then looks values up, tested below)."""
    one = {"edges": [0.0], "fractions": [0.5, 0.5]}
    return Reference({"features": [], "score": one, "raw": raw_bins(numeric, categorical, top=10)})


@pytest.fixture(scope="module")
def ref() -> Reference:
    return reference_of(*training_rows())


def looked_up(ref: Reference, batch: RawBatch) -> np.ndarray:
    """The codes of the batch's values looked up one by one in the reference's bins (no entries)."""
    return ref.raw_codes(RawBatch(batch.numeric, batch.categorical))


def test_codes_from_entries_equal_codes_from_values_on_every_gate_row_kind(
    spec: FeatureSpec, ref: Reference
) -> None:
    (numeric, categorical), groups = build_raw_rows(spec, MIN_ROWS, None)
    transform = RawTransform(spec.to_dict())
    assert ref.codes_by_entry(transform) is not None  # every bin value, "" included, has an entry
    for name, rows in groups.items():
        for n in (1, 3, DICT_ROWS, DICT_ROWS + 1, 200):  # the one-row, dict and table lookups
            few = slice(rows.start, rows.start + n)
            batch = RawBatch.from_rows(numeric[few], categorical[few])
            transform(batch)
            found = batch.entries()
            assert found is not None and found[0] is transform
            entries = np.asarray(found[1], np.intp).reshape(len(CATEGORICAL_FIELDS), -1)
            codes = ref.entry_codes(transform, batch.numeric, entries)
            assert codes is not None and np.array_equal(codes, looked_up(ref, batch)), (name, n)


def test_a_merged_batch_s_entries_give_its_requests_codes(spec: FeatureSpec, ref: Reference) -> None:
    (numeric, categorical), _ = build_raw_rows(spec, MIN_ROWS, None)
    transform = RawTransform(spec.to_dict())
    parts = [
        RawBatch.from_rows(numeric[i : i + k], categorical[i : i + k]) for i, k in ((0, 1), (5, 3), (40, 2))
    ]
    merged = RawBatch.concat(parts)
    transform(merged)  # what the dynamic batcher runs; drift is told of `merged` (BatchWatch)
    found = merged.entries()
    assert found is not None and found[0] is transform
    codes = ref.entry_codes(transform, merged.numeric, np.asarray(found[1]))
    assert codes is not None and np.array_equal(codes, looked_up(ref, merged))


def test_the_window_holds_the_same_rows_either_way_and_a_bin_the_spec_lacks_falls_back_to_lookups(
    spec: FeatureSpec, tmp_path: Path
) -> None:
    (numeric, categorical), _ = build_raw_rows(spec, MIN_ROWS, None)
    transform = RawTransform(spec.to_dict())
    sizes = ((0, 1), (1, 20), (21, 4), (25, 1))
    train_numeric, train_categorical = training_rows()
    unseen = train_categorical.copy()
    unseen[:900, 2] = "zzzzzzzz"  # C3's most frequent value in this reference: the spec never saw it
    for cats, by_entry in ((train_categorical, True), (unseen, False)):
        ref = reference_of(train_numeric, cats)
        assert (ref.codes_by_entry(transform) is not None) == by_entry
        monitor = DriftMonitor("ctr", 1_000, lambda: tmp_path)
        monitor.reference = lambda ref=ref: ref  # type: ignore[method-assign]
        requests = [RawBatch.from_rows(numeric[i : i + n], categorical[i : i + n]) for i, n in sizes]
        scores = [np.full((len(b), 1), i, np.float32) for i, b in enumerate(requests)]
        for batch, s in zip(requests, scores, strict=True):
            transform(batch)
            monitor.observe_batch(RAW_SIGNATURE, batch, s)
        monitor.flush()
        window = monitor.raw.filled()
        assert window.shape == (26, 40)
        want = np.hstack([np.concatenate([looked_up(ref, b) for b in requests]), np.concatenate(scores)])
        if by_entry:  # the single rows (scores 0 and 3) are joined after the others: order is no matter
            want = want[np.argsort(np.isin(want[:, -1], (0, 3)), kind="stable")]
        assert np.array_equal(window, want), by_entry


def test_single_rows_of_a_merged_batch_reach_the_window_too(spec: FeatureSpec, tmp_path: Path) -> None:
    """The batcher's single-row parts hold strided columns of the merged entries: their bytes cannot be
    joined, and the flush concatenates them instead."""
    (numeric, categorical), _ = build_raw_rows(spec, MIN_ROWS, None)
    transform = RawTransform(spec.to_dict())
    ref = reference_of(*training_rows())
    monitor = DriftMonitor("ctr", 1_000, lambda: tmp_path)
    monitor.reference = lambda: ref  # type: ignore[method-assign]
    parts = [RawBatch.from_rows(numeric[i : i + 1], categorical[i : i + 1]) for i in range(5)]
    transform(RawBatch.concat(parts))
    for i, part in enumerate(parts):
        monitor.observe_batch(RAW_SIGNATURE, part, np.full((1, 1), i, np.float32))
    monitor.flush()
    want = np.hstack(
        [np.concatenate([looked_up(ref, p) for p in parts]), np.arange(5, dtype=np.float32)[:, None]]
    )
    assert np.array_equal(monitor.raw.filled(), want)


def test_a_flush_comes_every_flush_requests_single_rows(spec: FeatureSpec, tmp_path: Path) -> None:
    """Single-row requests are flushed every FLUSH_REQUESTS (the pause of joining 256 set the p99)."""
    (numeric, categorical), _ = build_raw_rows(spec, MIN_ROWS, None)
    transform = RawTransform(spec.to_dict())
    ref = reference_of(*training_rows())
    monitor = DriftMonitor("ctr", 1_000, lambda: tmp_path)
    monitor.reference = lambda: ref  # type: ignore[method-assign]
    for i in range(FLUSH_REQUESTS):
        batch = RawBatch.from_rows(numeric[i : i + 1], categorical[i : i + 1])
        transform(batch)
        assert len(monitor.raw.filled()) == 0  # nothing flushed before the last one
        monitor.observe_batch(RAW_SIGNATURE, batch, np.zeros((1, 1), np.float32))
    assert len(monitor.raw.filled()) == FLUSH_REQUESTS


def test_two_versions_taking_turns_keep_their_rows_and_tables_until_one_flush(
    spec: FeatureSpec, tmp_path: Path
) -> None:
    """A traffic split's stable and canary transforms alternate request by request: each keeps its own pending
    rows and entry table (built once), and one flush bins both into the window."""
    (numeric, categorical), _ = build_raw_rows(spec, MIN_ROWS, None)
    stable, canary = RawTransform(spec.to_dict()), RawTransform(spec.to_dict())
    ref = reference_of(*training_rows())
    monitor = DriftMonitor("ctr", 1_000, lambda: tmp_path)
    monitor.reference = lambda: ref  # type: ignore[method-assign]
    flushes = []
    flush = monitor.flush
    monitor.flush = lambda: flushes.append(1) or flush()  # type: ignore[method-assign]
    requests = [RawBatch.from_rows(numeric[i : i + 1], categorical[i : i + 1]) for i in range(6)]
    for i, batch in enumerate(requests):
        (canary if i % 2 else stable)(batch)
        monitor.observe_batch(RAW_SIGNATURE, batch, np.full((1, 1), i, np.float32))
    assert flushes == []  # the turns flush nothing
    assert ref.codes_by_entry(stable) is ref.codes_by_entry(stable) is not ref.codes_by_entry(canary)
    monitor.flush()
    window = monitor.raw.filled()
    by_score = window[np.argsort(window[:, -1])]
    want = np.hstack(
        [np.concatenate([looked_up(ref, b) for b in requests]), np.arange(6, dtype=np.float32)[:, None]]
    )
    assert np.array_equal(by_score, want)
