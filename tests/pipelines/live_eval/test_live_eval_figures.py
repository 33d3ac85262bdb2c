"""The live figures' arithmetic: DeLong's AUC variance (ctr_model/metrics.py) against its O(m·n) definition and
a bootstrap; normalized entropy; the window's memory and key handling (pipelines/live_eval/figures.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ctr_model.metrics import delong_auc, log_loss, roc_auc
from pipelines.live_eval.figures import Part, Window, entropy, figures


def _delong_by_definition(y: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    x, z = s[y == 1], s[y == 0]
    psi = (x[:, None] > z[None, :]) + 0.5 * (x[:, None] == z[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return float(psi.mean()), float(v10.var(ddof=1) / len(x) + v01.var(ddof=1) / len(z))


def test_delong_equals_its_definition_with_ties():
    rng = np.random.default_rng(1)
    y = (rng.random(700) < 0.3).astype(int)
    s = np.round(rng.normal(size=700) + y, 1)  # many ties
    auc, var = delong_auc(y, s)
    want_auc, want_var = _delong_by_definition(y, s)
    assert auc == pytest.approx(want_auc, abs=1e-12) and auc == pytest.approx(roc_auc(y, s), abs=1e-12)
    assert var == pytest.approx(want_var, rel=1e-9)


def test_delong_variance_agrees_with_a_bootstrap():
    rng = np.random.default_rng(2)
    n = 3000
    y = (rng.random(n) < 0.15).astype(int)
    s = rng.normal(size=n) + 1.2 * y
    _, var = delong_auc(y, s)
    boot = [roc_auc(y[i], s[i]) for i in (rng.integers(0, n, n) for _ in range(300))]
    assert math.sqrt(var) == pytest.approx(float(np.std(boot)), rel=0.2)


def test_delong_needs_two_rows_of_each_class():
    with pytest.raises(ValueError, match="two rows of each class, got 1 positives"):
        delong_auc(np.array([1, 0, 0]), np.array([0.9, 0.1, 0.2]))


def test_normalized_entropy_is_one_for_the_base_rate_and_lower_for_a_ranking_model():
    y = np.array([1] * 20 + [0] * 80, dtype=np.int8)
    base = figures(("ctr", 1, "stable"), y, np.full(100, 0.2), min_rows=10, pending=0)
    assert base["ne"] == pytest.approx(1.0) and base["calibration_ratio"] == pytest.approx(1.0)
    assert base["auc"] == 0.5 and base["logloss"] == pytest.approx(entropy(0.2))
    good = figures(("ctr", 1, "stable"), y, np.where(y == 1, 0.6, 0.1), min_rows=10, pending=3)
    assert (
        good["ne"] == pytest.approx(log_loss(y, np.where(y == 1, 0.6, 0.1)) / entropy(0.2)) and good["ne"] < 1
    )
    assert (good["auc"], good["pending"], good["predicted"]) == (1.0, 3, pytest.approx(20 * 0.6 + 80 * 0.1))
    none = figures(("ctr", 1, "stable"), np.zeros(50, np.int8), np.full(50, 0.1), min_rows=10, pending=0)
    assert (none["auc"], none["ne"], none["calibration_ratio"], none["logloss"] is not None) == (
        None,
        None,
        None,
        True,
    )


def test_the_window_holds_only_its_intervals_arrays():
    w = Window(3)
    for j in range(10):
        k = w.key(("ctr", j % 2, "stable"))
        w.add(j, Part(np.full(1000, k, np.int32), np.full(1000, 0.1), np.zeros(1000, np.int8)))
    assert list(w.parts) == [7, 8, 9] and w.rows == 3000 and w.nbytes == 3000 * (4 + 8 + 1)
    assert [(f["version"], f["rows"]) for f in w.figures(1)] == [(0, 1000), (1, 2000)]
    with pytest.raises(ValueError, match="at least one interval"):
        Window(0)
