"""FeatureSpec: JSON round trip, finite output, stable hashing, and no torch in the serving-side import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctr_features.compiled.records import numeric_matrix
from ctr_features.data.split import validation_mask
from ctr_features.hashing import encode_strings, fnv1a_32, fnv1a_column
from ctr_features.layout import HASH_START, signed_log1p
from ctr_features.spec import FeatureSpec
from tests.training.reference_prepare import prepare
from training.data.cache import ensure_cache
from training.synth import sample_rows

N = 3000


def raw_rows(seed: int, n: int = N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Numeric [n,13], categorical strings [n,26] (None = missing) and labels, from the synthetic world."""
    rng = np.random.default_rng(seed)
    numeric, ranks = sample_rows(rng, n)
    cats = np.char.mod("%08x", ranks % 40).astype(object)
    cats[ranks < 0] = None
    labels = (rng.random(n) < 0.25 + 0.3 * (ranks[:, 8] == 0)).astype(np.float32)
    return numeric, cats, labels


def test_spec_round_trips_through_json_with_identical_vectors(tmp_path: Path) -> None:
    numeric, cats, labels = raw_rows(1)
    spec = FeatureSpec.fit(numeric, cats, labels, min_count=50)
    assert any(t.rate_values.size for t in spec.tables)  # the rate tables are exercised, not empty
    spec.save(tmp_path / "feature_spec.json")
    loaded = FeatureSpec.load(tmp_path / "feature_spec.json")
    new_numeric, new_cats, _ = raw_rows(2)
    a, b = spec.transform(new_numeric, new_cats), loaded.transform(new_numeric, new_cats)
    assert a.dtype == np.float32 and a.shape == (N, 128)
    assert a.tobytes() == b.tobytes()


def test_transform_is_finite_for_nan_inf_and_huge_counts() -> None:
    numeric, cats, labels = raw_rows(1)
    spec = FeatureSpec.fit(numeric, cats, labels)
    bad = np.array([[np.nan, np.inf, -np.inf, 1e300, -1e300, 0, -1, 5, 1e9, np.nan, 2, 3, 4]])
    out = spec.transform(bad, np.array([[None] * 26], dtype=object))
    assert np.isfinite(out).all()
    assert out[0, 13:16].tolist() == [1.0, 1.0, 1.0]  # nan, inf, -inf count as missing
    assert out[0, 3] == spec.clip and out[0, 4] == -spec.clip


def test_width_is_configurable_and_each_field_lands_in_one_bucket() -> None:
    numeric, cats, labels = raw_rows(1)
    spec = FeatureSpec.fit(numeric, cats, labels, width=64)
    out = spec.transform(numeric, cats)
    assert out.shape == (N, 64)
    assert out[:, HASH_START:].sum(axis=1).tolist() == [26.0] * N


def test_string_arrays_and_packed_columns_give_the_same_vectors() -> None:
    numeric, cats, labels = raw_rows(1)
    spec = FeatureSpec.fit(numeric, cats, labels, min_count=50)
    packed = [encode_strings(cats[:, j].tolist()) for j in range(26)]
    assert spec.transform(numeric, cats).tobytes() == spec.transform(numeric, packed).tobytes()


def test_vocabulary_values_take_their_fnv_bucket_and_others_the_oov_column() -> None:
    numeric, cats, labels = raw_rows(1)
    spec = FeatureSpec.fit(numeric, cats, labels, vocab_min_count=1)
    seen = cats[0, 5] or ""
    assert seen.encode() in set(spec.tables[5].vocab.tolist())
    row = np.array([["never-seen-é"] * 5 + list(cats[0, 5:])], dtype=object)  # C6..C26: training values
    out = spec.transform(numeric[:1], row)
    expected = HASH_START + fnv1a_32("C6:" + seen) % spec.buckets
    assert out[0, expected] >= 1.0
    assert out[0, spec.oov_column] == 5.0  # C1..C5 hold a value no vocabulary has
    assert spec.buckets == 128 - HASH_START - 1


def test_vectorised_fnv1a_matches_the_scalar_definition() -> None:
    values = ["05db9164", "", "héllo", "a" * 40, "68fd1e64"]
    assert fnv1a_column(encode_strings(values), prefix="C6:").tolist() == [
        fnv1a_32("C6:" + v) for v in values
    ]
    assert fnv1a_32("") == 0x811C9DC5 and fnv1a_32("a") == 0xE40C292C  # published FNV-1a test vectors


def test_rejects_wrong_numeric_shape_and_bad_spec_file(tmp_path: Path) -> None:
    numeric, cats, labels = raw_rows(1)
    spec = FeatureSpec.fit(numeric, cats, labels)
    with pytest.raises(ValueError, match=r"expected numeric fields of shape \[N, 13\], got \[3000, 12\]"):
        spec.transform(numeric[:, :12], cats)
    (tmp_path / "spec.json").write_text('{"version": 99}')
    with pytest.raises(ValueError, match="version 99 is not supported"):
        FeatureSpec.load(tmp_path / "spec.json")


def test_spec_is_fitted_on_training_rows_only(data_copy: Path) -> None:
    cache = ensure_cache(data_copy)[0]
    data = prepare(cache, val_fraction=0.1, width=128)
    assert set(data.train_ids.tolist()).isdisjoint(data.val_ids.tolist())
    assert len(data.train_ids) + len(data.val_ids) == 4000
    table = pq.read_table(cache)
    train = table.filter(pa.array(~validation_mask(table.column("row_id").to_numpy(), 0.1)))
    expected = np.nanmean(signed_log1p(numeric_matrix(train)), axis=0)
    np.testing.assert_allclose(data.spec.mean, expected, rtol=1e-12)


def test_features_module_imports_without_torch() -> None:
    code = "import sys, ctr_features.spec; assert 'torch' not in sys.modules and 'pyarrow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
