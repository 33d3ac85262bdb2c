"""The parity harness (ctr_features/parity.py): every compiled form of the FeatureSpec gives the reference
`FeatureSpec.transform`'s features on the gate's row kinds, and the harness refuses a form that does not."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from ctr_features.errors import FeatureParityError
from ctr_features.parity import FORMS, build_raw_rows, check_forms, compiled_forms, installed, table_form
from ctr_features.spec import FeatureSpec

GROUPS = ("vocabulary", "unseen", "all_missing", "extreme_counts", "odd_strings", "random")


def fit_small_spec(seed: int = 5, n: int = 3_000, width: int = 96) -> FeatureSpec:
    """A FeatureSpec fitted on `n` synthetic rows: counts with missing cells, values from 40 per field."""
    rng = np.random.default_rng(seed)
    numeric = np.floor(np.expm1(rng.uniform(0, 8, (n, 13))))
    numeric[rng.random(numeric.shape) < 0.1] = np.nan
    ranks = rng.zipf(1.5, (n, 26)) % 40
    categorical = np.char.mod("%08x", ranks * 7919).astype(object)
    categorical[rng.random(categorical.shape) < 0.05] = ""
    labels = (rng.random(n) < 0.2 + 0.3 * (ranks[:, 3] == 1)).astype(np.float32)
    return FeatureSpec.fit(numeric, categorical, labels, width=width, min_count=20, vocab_min_count=5)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_small_spec()


@pytest.fixture(scope="module")
def rows(spec: FeatureSpec) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, slice]]:
    numeric, categorical = build_raw_rows(spec, 0, None, seed=11)[0]
    validation = (numeric[-300:], categorical[-300:])  # a stand-in for val_raw.npz
    return build_raw_rows(spec, 2_000, validation, seed=3)


def test_the_rows_hold_every_gate_row_kind(
    rows: tuple[tuple[np.ndarray, np.ndarray], dict[str, slice]],
) -> None:
    (numeric, categorical), groups = rows
    assert tuple(groups) == ("validation", *GROUPS)
    assert len(numeric) == len(categorical) == 2_000
    assert np.isnan(numeric[groups["all_missing"]]).all() and (categorical[groups["all_missing"]] == "").all()
    assert np.isinf(numeric[groups["extreme_counts"]]).any()
    odd = set(categorical[groups["odd_strings"]].ravel().tolist())
    assert {"日本語", "a" * 300, ""} <= odd


@pytest.mark.parametrize("name", list(FORMS))
def test_every_compiled_form_gives_the_reference_features(
    spec: FeatureSpec, rows: tuple[tuple[np.ndarray, np.ndarray], dict[str, slice]], name: str
) -> None:
    missing = [lib for lib in FORMS[name] if importlib.util.find_spec(lib) is None]
    if missing:
        pytest.skip(f"form {name} needs {', '.join(missing)}, which is not installed")
    (numeric, categorical), groups = rows
    # Every form computes the reference's steps (float64, then float32): bit for bit, tolerance 0.
    report = check_forms(spec, (numeric, categorical), groups, compiled_forms(spec, [name]), 0.0)
    found = report["forms"][name]
    assert set(found["max_abs_diff_by_group"]) == set(groups) and found["max_abs_diff"] == 0.0


def test_the_records_encoders_make_the_same_records(spec: FeatureSpec) -> None:
    pa = pytest.importorskip("pyarrow")
    from ctr_features.compiled.records import encode, encode_records, lookups

    (numeric, categorical), _ = build_raw_rows(spec, 1_000, None, seed=4)
    table = pa.table(
        {
            "label": pa.array(np.arange(len(numeric)) % 2, pa.int8()),
            **{f"I{i + 1}": pa.array(numeric[:, i], pa.float64()) for i in range(13)},
            **{f"C{j + 1}": pa.array(categorical[:, j].tolist(), pa.string()) for j in range(26)},
        }
    )
    index = np.arange(len(numeric), dtype=np.int64) + 7
    a, b = encode(spec, table, index), encode_records(spec, lookups(spec), table, index)
    assert a.tobytes() == b.tobytes()
    assert a["y"].tolist() == (np.arange(len(numeric)) % 2).tolist() and a["index"][0] == 7


def test_the_served_table_keeps_its_answers_on_a_second_pass(spec: FeatureSpec) -> None:
    (numeric, categorical), _ = build_raw_rows(spec, 800, None, seed=9)
    once = table_form(spec, sizes=(1,))(numeric[:40], categorical[:40])  # single rows: the one-row paths
    np.testing.assert_array_equal(once, spec.transform(numeric[:40], categorical[:40]))
    np.testing.assert_array_equal(
        table_form(spec)(numeric, categorical), spec.transform(numeric, categorical)
    )


def test_a_form_that_differs_is_refused_with_its_group(
    spec: FeatureSpec, rows: tuple[tuple[np.ndarray, np.ndarray], dict[str, slice]]
) -> None:
    (numeric, categorical), groups = rows

    def forgets_inf(n: np.ndarray, c: np.ndarray) -> np.ndarray:
        out = spec.transform(n, c)
        out[groups["extreme_counts"], 0] += 2e-5  # e.g. a form that forgot that ±Inf counts are missing
        return out

    with pytest.raises(
        FeatureParityError,
        match=r"^feature parity failed: form broken differs from FeatureSpec.transform by 2e-05 > tolerance "
        r"1e-05 \(by group: .*'extreme_counts': 2",
    ):
        check_forms(spec, (numeric, categorical), groups, {"broken": forgets_inf}, 1e-5)
    with pytest.raises(FeatureParityError, match=r"form short gave float32 \[0, 96\], expected float32"):
        check_forms(
            spec, (numeric, categorical), groups, {"short": lambda n, c: np.zeros((0, 96), np.float32)}, 0
        )


def test_forms_without_their_libraries_are_left_out(
    spec: FeatureSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert installed("table")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a)
    )
    assert not installed("tf_graph")
    assert "tf_graph" not in compiled_forms(spec, ["tf_graph", "table"])
