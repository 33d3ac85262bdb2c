"""ctr_model.calibration and the calibration metrics: fits on synthetic rows with a known miscalibration, the
downsampling correction, the dict form, the errors, and the float32 module against the float64 reference
(PyTorch and ONNX Runtime) at the parity gate's 1e-5."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ctr_model.calibration import (
    MIN_CALIBRATION_ROWS,
    CalibratedNet,
    CalibrationDataError,
    Calibrator,
    fit_calibrator,
)
from ctr_model.calibration_fit import MAX_SLOPE
from ctr_model.metrics import calibration_ratio, expected_calibration_error, field_calibration_error

PARITY = 1e-5  # the parity gate's tolerance (export/gates/parity.py)


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-t))


def miscalibrated(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits z of a net whose true click probability is sigmoid(1.5 z - 0.7): overconfident low, 49% too high."""
    rng = np.random.default_rng(seed)
    z = rng.normal(-1.0, 1.5, rows)
    return z, (rng.random(rows) < _sigmoid(1.5 * z - 0.7)).astype(np.float64)


@pytest.fixture(scope="module")
def rows() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """200k rows to fit on (100k per half) and 200k fresh held-out rows of the same click model."""
    z, y = miscalibrated(200_000, seed=1)
    z_new, y_new = miscalibrated(200_000, seed=2)
    return z, y, z_new, y_new


@pytest.mark.parametrize("method", ["isotonic", "platt"])
def test_calibrator_fixes_a_known_miscalibration_on_fresh_rows(method: str, rows: tuple) -> None:
    z, y, z_new, y_new = rows
    cal, report = fit_calibrator(z, y, method)
    before = _sigmoid(z_new)
    assert expected_calibration_error(y_new, before) > 0.1  # 0.1095
    assert calibration_ratio(y_new, before) > 1.45  # 1.499
    after = cal.apply(z_new)
    assert expected_calibration_error(y_new, after) < 0.01  # measured: isotonic 0.0017, platt 0.0011
    assert 0.98 <= calibration_ratio(y_new, after) <= 1.02
    assert cal.method == report["method"] == method
    assert report["chosen_by"] == "requested"
    assert (report["fit_rows"], report["report_rows"]) == (100_000, 100_000)
    assert list(report["candidates"]) == [method]
    assert report["after"] == report["candidates"][method]
    assert report["before"]["ece"] > 0.1 and report["after"]["ece"] < 0.01
    assert 0.98 <= report["after"]["calibration_ratio"] <= 1.02
    assert abs(report["after"]["auc"] - report["before"]["auc"]) < 0.002  # a monotone map keeps the ranking
    if method == "platt":  # the click model itself
        assert cal.a == pytest.approx(1.5, abs=0.03) and cal.b == pytest.approx(-0.7, abs=0.03)


def test_auto_keeps_the_candidate_with_the_lower_report_ece(rows: tuple) -> None:
    z, y, _, _ = rows
    cal, report = fit_calibrator(z, y)
    candidates = report["candidates"]
    assert list(candidates) == ["isotonic", "platt"]
    best = min(candidates, key=lambda m: candidates[m]["ece"])
    assert cal.method == report["method"] == best
    assert report["chosen_by"] == "lower ECE on the report half"
    assert report["after"] == candidates[best]
    assert set(report["after"]) == {
        "ece",
        "calibration_ratio",
        "logloss",
        "auc",
        "mean_predicted",
        "observed",
    }


def test_fit_chooses_on_even_rows_reports_on_odd_rows_and_refits_on_all(rows: tuple) -> None:
    z, y, _, _ = rows
    cal, report = fit_calibrator(z[:20_001], y[:20_001], "platt")
    assert (report["fit_rows"], report["report_rows"], report["refit_rows"]) == (10_001, 10_000, 20_001)
    # Every even row twice is the even half's fit (a duplicated row weighs as one row counted twice).
    half, _ = fit_calibrator(
        np.repeat(z[:20_001:2], 2)[:20_001], np.repeat(y[:20_001:2], 2)[:20_001], "platt"
    )
    odd = slice(1, 20_001, 2)
    assert report["after"]["ece"] == pytest.approx(
        expected_calibration_error(y[odd], half.apply(z[odd])), abs=1e-6
    )
    # The served calibrator is fitted on every row: Platt's intercept makes its mean prediction the mean click.
    assert cal.a != pytest.approx(half.a, abs=1e-6)
    assert calibration_ratio(y[:20_001], cal.apply(z[:20_001])) == pytest.approx(1.0, abs=1e-3)


def test_negative_downsampling_is_corrected_before_the_calibrator() -> None:
    rng = np.random.default_rng(5)
    feature = rng.normal(0.0, 1.0, 400_000)
    clicks = (rng.random(400_000) < _sigmoid(1.2 * feature - 1.8)).astype(np.float64)  # CTR about 0.18
    train, held = slice(0, 200_000), slice(200_000, None)
    w = 0.25
    keep = (clicks[train] == 1) | (rng.random(200_000) < w)  # every positive, a quarter of the negatives
    # "training": a logistic model of the downsampled rows (Platt on the feature is exactly that)
    net, _ = fit_calibrator(feature[train][keep], clicks[train][keep], "platt")
    z = net.a * feature[held] + net.b  # the trained net's logits on untouched held-out rows
    y = clicks[held]
    assert calibration_ratio(y, _sigmoid(z)) > 2.0  # without the correction: odds four times too high
    corrected = Calibrator("none", negative_rate=w).apply(z)
    assert expected_calibration_error(y, corrected) < 0.01
    assert 0.98 <= calibration_ratio(y, corrected) <= 1.02
    cal, report = fit_calibrator(z, y, "auto", negative_rate=w)
    assert cal.negative_rate == w
    assert report["before"]["ece"] < 0.01  # q = sigmoid(z + ln w) is already calibrated
    assert report["after"]["ece"] < 0.01 and 0.98 <= report["after"]["calibration_ratio"] <= 1.02


def test_isotonic_map_is_monotone_bounded_and_flat_outside_its_knots(rows: tuple) -> None:
    z, y, _, _ = rows
    for max_knots in (4, 32):
        cal, _ = fit_calibrator(z, y, "isotonic", max_knots=max_knots)
        kx, ky = np.array(cal.knots_x), np.array(cal.knots_y)
        assert 2 <= len(kx) <= max_knots
        assert (np.diff(kx) > 0).all() and (np.diff(ky) >= 0).all()
        assert (np.diff(ky) / np.diff(kx)).max() <= MAX_SLOPE
        grid = np.linspace(-12.0, 12.0, 20_001)  # logits: q from 6e-6 to 1 - 6e-6
        ctr = cal.apply(grid)
        assert (np.diff(ctr) >= -1e-12).all()
        q = _sigmoid(grid)
        np.testing.assert_allclose(ctr[q <= kx[0]], ky[0], atol=1e-12)
        np.testing.assert_allclose(ctr[q >= kx[-1]], ky[-1], atol=1e-12)
        np.testing.assert_allclose(
            cal.apply(np.log(kx / (1 - kx))), ky, atol=1e-9
        )  # passes through its knots


def test_a_reversed_net_is_never_reversed_back(rows: tuple) -> None:
    z, y, _, _ = rows
    platt, _ = fit_calibrator(-z, y, "platt")
    assert platt.a == 0.05  # clipped at PLATT_SLOPE_RANGE's floor: a calibrator keeps the ranking's sign
    isotonic, report = fit_calibrator(-z, y, "isotonic")
    assert len(isotonic.knots_x) == 1  # PAV pools everything: one constant, the click rate
    assert isotonic.knots_y[0] == pytest.approx(y.mean())  # refit on every row
    assert report["after"]["auc"] == 0.5


def test_apply_keeps_the_shape_of_its_logits(rows: tuple) -> None:
    z, y, _, _ = rows
    cal, _ = fit_calibrator(z[:4000], y[:4000], "isotonic")
    column = cal.apply(z[:10].reshape(-1, 1))
    assert column.shape == (10, 1)
    np.testing.assert_array_equal(column.reshape(-1), cal.apply(z[:10]))


def test_to_dict_round_trips_through_json_and_ignores_a_report_beside_it(rows: tuple) -> None:
    z, y, _, _ = rows
    for method in ("isotonic", "platt", "none"):
        cal, report = fit_calibrator(z[:4000], y[:4000], method, negative_rate=0.5)
        doc = json.loads(json.dumps({**cal.to_dict(), **report}))
        assert Calibrator.from_dict(doc) == cal
        assert Calibrator.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert Calibrator.from_dict({"method": "none"}) == Calibrator("none")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "a calibrator is a JSON object, got list"),
        ({"a": 1.0}, "calibrator has no 'method' (keys: ['a'])"),
        ({"method": "auto"}, "one of ('isotonic', 'platt', 'none'), got 'auto' (auto resolves"),
        ({"method": "spline"}, "got 'spline'"),
        ({"method": "none", "negative_rate": 0}, "negative_rate must be a number in (0, 1], got 0.0"),
        ({"method": "none", "negative_rate": 1.5}, "negative_rate must be a number in (0, 1], got 1.5"),
        ({"method": "none", "negative_rate": "1"}, "calibrator 'negative_rate' must be a number, got '1'"),
        ({"method": "platt", "a": -1.0}, "platt calibrator needs a in [0.05, 10.0]"),
        ({"method": "platt", "b": float("nan")}, "and a finite b"),
        ({"method": "none", "a": 2.0}, "a none calibrator has a = 1 and b = 0, got a = 2.0"),
        ({"method": "platt", "knots_x": [0.5], "knots_y": [0.5]}, "a platt calibrator has no knots"),
        ({"method": "isotonic"}, "needs 1 to 256 knots with as many y as x, got 0 x and 0 y"),
        ({"method": "isotonic", "knots_x": [0.1, 0.2], "knots_y": [0.1]}, "got 2 x and 1 y"),
        ({"method": "isotonic", "knots_x": "0.1", "knots_y": [0.1]}, "'knots_x' must be a list of numbers"),
        ({"method": "isotonic", "knots_x": [0.1, 1.2], "knots_y": [0.1, 0.2]}, "knots_x must lie in [0, 1]"),
        (
            {"method": "isotonic", "knots_x": [0.2, 0.2], "knots_y": [0.1, 0.2]},
            "must increase strictly, got 0.2",
        ),
        (
            {"method": "isotonic", "knots_x": [0.1, 0.2], "knots_y": [0.3, 0.2]},
            "must not decrease, got 0.3 then",
        ),
        (
            {"method": "isotonic", "knots_x": [0.1, 0.11], "knots_y": [0.1, 0.3]},
            "slope 20 between knots 0 and 1",
        ),
    ],
)
def test_from_dict_rejects_a_bad_calibrator(doc: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        Calibrator.from_dict(doc)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_too_few_rows_or_one_class_is_refused_in_one_line_unless_none() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=5000)
    cases = {
        "short": (z[:999], (rng.random(999) < 0.3).astype(float), "has 999 rows, "),
        "no clicks": (z, np.zeros(5000), "has 5000 rows, 0 positives, 5000 negatives; "),
        "all clicks": (z, np.ones(5000), "has 5000 rows, 5000 positives, 0 negatives; "),
    }
    for logits, labels, counts in cases.values():
        for method in ("auto", "isotonic", "platt"):
            with pytest.raises(CalibrationDataError) as info:
                fit_calibrator(logits, labels, method, source="RUN/val_labels.npy")
            message = str(info.value)
            assert message.startswith(f"RUN/val_labels.npy {counts}")
            assert message.endswith(
                f"fitting a calibrator needs at least {MIN_CALIBRATION_ROWS} rows with 10 positives and "
                "10 negatives; give more held-out rows (e.g. a larger --val-fraction) or --calibration none"
            )
        cal, report = fit_calibrator(logits, labels, "none")
        assert cal == Calibrator("none") and report["method"] == "none"
    _, report = fit_calibrator(z[:1], np.zeros(1), "none")
    assert report["before"] is None and report["after"] is None  # no row in the report half
    _, report = fit_calibrator(z, np.zeros(5000), "none")
    assert report["after"]["auc"] is None and report["after"]["calibration_ratio"] == float("inf")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"method": "Platt"},
            "calibration method must be one of ('auto', 'isotonic', 'platt', 'none'), got 'Platt'",
        ),
        ({"negative_rate": 0.0}, "negative_rate must be a number in (0, 1], got 0.0"),
        ({"negative_rate": 2}, "negative_rate must be a number in (0, 1], got 2"),
        ({"max_knots": 1}, "max_knots must be in [2, 256], got 1"),
        ({"labels": np.zeros(3)}, "the held-out set has 2000 logits but 3 labels"),
        ({"labels": np.full(2000, 0.5)}, "the held-out set has label 0.5 at row 0; expected 0 or 1"),
        ({"logits": np.full(2000, np.nan)}, "the held-out set has a non-finite logit nan at row 0"),
        (
            {"logits": np.zeros((2000, 2))},
            "calibration logits of the held-out set must be (N,) or (N, 1), got (2000, 2)",
        ),
    ],
)
def test_fit_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    args = {"logits": np.zeros(2000), "labels": np.arange(2000) % 2, **kwargs}
    with pytest.raises(ValueError) as info:
        fit_calibrator(**args)
    assert str(info.value) == message


def calibrators(rows: tuple) -> dict[str, Calibrator]:
    z, y, _, _ = rows
    fitted = {
        m: fit_calibrator(z[:20_000], y[:20_000], m, negative_rate=0.3)[0] for m in ("isotonic", "platt")
    }
    return {
        **fitted,
        "none": Calibrator("none"),
        "none w=0.3": Calibrator("none", negative_rate=0.3),
        "isotonic 1 knot": Calibrator("isotonic", knots_x=(0.3,), knots_y=(0.4,)),
    }


def test_calibrated_net_in_float32_matches_the_float64_reference(rows: tuple) -> None:
    logits = np.random.default_rng(3).normal(-1.0, 4.0, (10_000, 1)).astype(np.float32)
    for name, cal in calibrators(rows).items():
        with torch.no_grad():
            ctr, raw = CalibratedNet(nn.Identity(), cal).eval()(torch.from_numpy(logits))
        assert ctr.dtype == raw.dtype == torch.float32 and ctr.shape == raw.shape == (10_000, 1)
        reference = cal.apply(logits.astype(np.float64))
        assert np.abs(ctr.numpy() - reference).max() < PARITY, name  # measured: <= 2.5e-7
        assert np.abs(raw.numpy() - _sigmoid(logits.astype(np.float64))).max() < PARITY, name


def export(model: nn.Module, width: int, path: Path) -> None:
    """torch.onnx.export as export/onnx/onnx_export.py calls it (dynamo, opset 17, dynamic batch)."""
    quiet = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (torch.zeros(2, width),),
                str(path),
                input_names=["features"],
                output_names=["ctr", "raw_score"],
                opset_version=17,
                dynamo=True,
                external_data=False,
                dynamic_shapes={"features": {0: torch.export.Dim("batch")}},
                verbose=False,
            )
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def test_calibrated_net_exports_to_translator_ops_and_onnxruntime_matches(
    rows: tuple, tmp_path: Path
) -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from export.onnx.targets import PROFILES, TRANSLATOR_OPS

    torch.manual_seed(0)
    features = np.random.default_rng(4).normal(0.0, 1.0, (10_000, 8)).astype(np.float32)
    for name, cal in calibrators(rows).items():
        model = CalibratedNet(nn.Linear(8, 1), cal).eval()
        path = tmp_path / f"{name}.onnx"
        export(model, 8, path)
        proto = onnx.load(str(path))
        ops = {node.op_type for node in proto.graph.node}
        assert ops <= TRANSLATOR_OPS, name
        assert ops <= PROFILES["minimal"], name  # every method stays inside the conservative profile
        assert [o.name for o in proto.graph.output] == ["ctr", "raw_score"]
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        ctr, raw = session.run(None, {"features": features})
        with torch.no_grad():
            torch_ctr, torch_raw = model(torch.from_numpy(features))
            z = model.net(torch.from_numpy(features)).numpy().astype(np.float64)
        assert np.abs(ctr - torch_ctr.numpy()).max() < PARITY, name  # measured: <= 3e-7
        assert np.abs(raw - torch_raw.numpy()).max() < PARITY, name
        assert np.abs(ctr - cal.apply(z)).max() < PARITY, name


def test_expected_calibration_error_and_ratio_values() -> None:
    labels = np.tile([1.0, 1.0] + [0.0] * 8, 10)  # 20% clicks in every block of 10 rows
    assert expected_calibration_error(labels, np.full(100, 0.2)) == pytest.approx(0.0, abs=1e-12)
    assert expected_calibration_error(labels, np.full(100, 0.3)) == pytest.approx(0.1, abs=1e-12)
    # 2 bins of 50 sorted rows: 50 x 0.1 without clicks (off by 0.1); 30 x 0.1 and the 20 clicks at 0.9
    # (mean 0.42 against 0.4): (0.1 * 50 + 0.02 * 50) / 100
    probs = np.where(labels == 1, 0.9, 0.1)
    assert expected_calibration_error(labels, probs, bins=2) == pytest.approx(0.06)
    assert calibration_ratio(labels, np.full(100, 0.3)) == pytest.approx(1.5)
    assert calibration_ratio(np.zeros(4), np.full(4, 0.1)) == float("inf")
    assert np.isnan(calibration_ratio(np.zeros(4), np.zeros(4)))
    with pytest.raises(ValueError, match=r"^labels and probabilities differ in length: 3 vs 2$"):
        calibration_ratio(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match=r"^the calibration ratio needs at least one row, got none$"):
        calibration_ratio(np.zeros(0), np.zeros(0))


def test_field_calibration_error_names_the_worst_field_and_value() -> None:
    # rows 0-99 predicted 0.5, rows 100-199 predicted 0.1; clicks on rows 0-29 and 100-109
    labels = np.zeros(200)
    labels[:30] = labels[100:110] = 1.0
    probs = np.r_[np.full(100, 0.5), np.full(100, 0.1)]
    a = np.array(["x"] * 100 + ["y"] * 100, dtype=object)  # x: 0.5 vs 0.3, y: 0.1 vs 0.1 -> 0.1
    b = np.array((["p"] * 50 + ["q"] * 50) * 2, dtype=object)  # p: 0.3 vs 0.4, q: 0.3 vs 0.0 -> 0.2
    c = np.array(["a"] * 50 + [f"r{i // 10}" for i in range(50)] + ["a"] * 100, dtype=object)
    c[0] = None  # counts as the empty string: one row
    cat = np.stack([a, b, c], axis=1)
    fields = ["A", "B", "C"]
    got = field_calibration_error(labels, probs, cat, fields, top=10, min_rows=20)
    assert got == {"field": "B", "value_error": pytest.approx(0.2), "worst_value": "q", "rows": 200}
    got = field_calibration_error(labels, probs, cat[:, [0, 2]], ["A", "C"], min_rows=20)
    assert got == {"field": "A", "value_error": pytest.approx(0.1), "worst_value": "x", "rows": 200}
    # min_rows 120: only C's "a" (rows 1-49 and 100-199) is frequent enough; the rare r0..r4 and "" never count
    got = field_calibration_error(labels, probs, cat, fields, min_rows=120)
    gap = abs((49 * 0.5 + 100 * 0.1) / 149 - 39 / 149)
    assert got == {"field": "C", "value_error": pytest.approx(gap), "worst_value": "a", "rows": 149}
    # top=1 keeps each field's most frequent value only: A's "x" (first of the tie), B's "p", C's "a"
    got = field_calibration_error(labels, probs, cat, fields, top=1, min_rows=20)
    assert got == {"field": "A", "value_error": pytest.approx(0.2), "worst_value": "x", "rows": 100}
    with pytest.raises(ValueError, match=r"^no categorical field has a value with 500 rows among 200 rows"):
        field_calibration_error(labels, probs, cat, fields, min_rows=500)
    with pytest.raises(
        ValueError, match=r"^categorical must be \(rows, fields\) = \(200, 2\), got \(200, 3\)$"
    ):
        field_calibration_error(labels, probs, cat, ["A", "B"])
