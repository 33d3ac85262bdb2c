"""Single-row REST bodies merged as the dynamic batcher merges them (RawBatch.concat of the scan's batches): the
merged batch's transform (the native categorical columns of ctr_features/compiled/_table_native.c's `cells`,
numpy for the counts) equals `FeatureSpec.transform` and the numpy transform, and every part gets its own
contiguous share of the entries, equal to a lookup of its values."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from ctr_features.compiled import few_rows
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import DICT_ROWS, RawTransform
from ctr_features.parity import build_raw_rows
from ctr_features.spec import FeatureSpec
from export.gates.parity import MIN_ROWS
from serving.codecs import raw_body
from serving.codecs.raw_body import client_rows
from serving.codecs.rest_codec import decode_raw_body
from tests.serving.codecs.test_unit_raw_fast import fit_spec

pytestmark = pytest.mark.skipif(
    few_rows._native_cells is None or raw_body.scan is None, reason="the native extensions are not built"
)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


@pytest.fixture(scope="module")
def gate(spec: FeatureSpec) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, slice]]:
    """The parity gate's raw rows, (numeric, categorical) row-major, and their groups."""
    return build_raw_rows(spec, MIN_ROWS, None)


def one_row_parts(gate: Any, group: str, n: int) -> tuple[list[RawBatch], list[int]]:
    """The one-row bodies the scan takes among n of a gate group, each scanned (as concurrent requests arrive),
    and their rows' indices."""
    (numeric, categorical), groups = gate
    rows, start = client_rows(numeric, categorical), groups[group].start
    parts, taken = [], []
    for i in range(start, start + n):
        found = decode_raw_body(orjson.dumps({"instances": [rows[i]]}))
        if found is not None:
            parts.append(found[1])
            taken.append(i)
    return parts, taken


@pytest.mark.parametrize("n", [DICT_ROWS + 1, 64, 300])
def test_merged_single_rows_transform_as_the_feature_spec_and_keep_their_entries(
    spec: FeatureSpec, gate: Any, n: int
) -> None:
    (numeric, categorical), _ = gate
    transform, reference = RawTransform(spec.to_dict()), RawTransform(spec.to_dict())
    parts, few = one_row_parts(gate, "vocabulary", n)
    merged = RawBatch.concat(parts)
    assert len(merged) == n == len(few) and all(len(p) == 1 for p in parts)
    got = transform.serving_call()(merged)
    assert np.array_equal(got, spec.transform(numeric[few], categorical[few]))
    owner, entries = merged.entries()  # type: ignore[misc]
    assert owner is transform and np.array_equal(entries, reference.entries(merged))
    # Drift is told of the merged batch (serving/runtime/batcher.py, BatchWatch): its parts keep no entries.
    assert all(part.entries() is None for part in parts)


def test_the_native_categorical_columns_equal_the_numpy_transforms(
    spec: FeatureSpec, gate: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every gate group (vocabulary, unseen, missing, extreme counts...) of a keyed batch: `cells` + numpy for the
    counts, against numpy alone (the path of a batch whose values are not all keyed)."""
    transform = RawTransform(spec.to_dict())
    numpy_only = RawTransform(spec.to_dict())
    assert numpy_only._one_row is not None
    monkeypatch.setattr(numpy_only._one_row, "categorical", lambda batch: None)
    taken = 0
    for group in gate[1]:
        parts, _ = one_row_parts(gate, group, 40)
        if len(parts) <= DICT_ROWS:
            continue
        taken += 1
        merged = RawBatch.concat(parts)
        assert transform._one_row is not None and transform._one_row.categorical(merged) is not None
        assert np.array_equal(transform(merged), numpy_only(RawBatch.concat(parts)))
        assert np.array_equal(merged.entries()[1], numpy_only.entries(merged))  # type: ignore[index]
    assert taken >= 3


def test_single_rows_whose_keys_are_strided_views_merge_alike(spec: FeatureSpec, gate: Any) -> None:
    """A part's (26, 1) keys that are a column of a wider array are no block of bytes: they are joined by numpy
    instead, to the same keys (row-major) and the same features."""
    transform = RawTransform(spec.to_dict())
    parts, _ = one_row_parts(gate, "vocabulary", 20)
    wide = np.concatenate([p.keys.key for p in parts], axis=1)  # type: ignore[union-attr]
    strided = [RawBatch.of_scan(p.numeric, wide[:, i : i + 1]) for i, p in enumerate(parts)]
    assert not strided[0].keys.key.flags.c_contiguous  # type: ignore[union-attr]
    joined, viewed = RawBatch.concat(parts), RawBatch.concat(strided)
    assert joined.keys is not None and viewed.keys is not None
    assert np.array_equal(joined.keys.key, wide) and np.array_equal(viewed.keys.key, wide)
    assert joined.keys.key.T.flags.c_contiguous and viewed.keys.key.T.flags.c_contiguous
    assert np.array_equal(transform(joined), transform(viewed))
