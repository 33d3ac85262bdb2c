"""The calibrator fitted at export: the network's logit z -> a calibrated click probability.

With w the run's negative sample rate (training kept a fraction w of the negatives), the net's odds are 1/w too
high; the exact correction in logit space is q = sigmoid(z + ln w) (= p / (p + (1 - p) / w)). The calibrator
then maps q to the served ctr:
- `platt`: ctr = sigmoid(a * (z + ln w) + b), a and b fitted by Newton's method on the log loss;
- `isotonic`: the pool-adjacent-violators fit of the labels on q, reduced to at most 32 knots (x_k, y_k),
  linear between them and flat outside; evaluated as ctr = y_0 + sum_k s_k * (relu(q - x_k) - relu(q - x_k+1))
  (s_k: segment k's slope), i.e. only Sub, Relu, MatMul and Add in a graph;
- `none`: ctr = q.
`Calibrator.apply` is the float64 numpy reference; `CalibratedNet` computes the same in float32 with the same op
order the ONNX graph has. Each term lies in [0, s_k * (x_k+1 - x_k)], so the sum has no cancellation; its float32
rounding is about float32's epsilon times sum_k s_k * (1 - x_k), which the fit and the validation bound by
MAX_SEGMENT_MASS (and each slope by MAX_SLOPE): well under the 1e-5 parity tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ctr_model.calibration_fit import MAX_KNOTS, PLATT_SLOPE_RANGE, check_knots, fit_isotonic_knots, fit_platt
from ctr_model.metrics import calibration_ratio, expected_calibration_error, log_loss, roc_auc

METHODS = ("auto", "isotonic", "platt", "none")
FITTED_METHODS = ("isotonic", "platt", "none")  # what a Calibrator holds: auto resolves at fit
# Both halves together. 1000 rows put about 500 in each half: ten ECE bins of 50 rows, whose click rate is known
# to about +-0.06 at CTR 0.25; fewer rows make the fit and the figures that choose it mostly noise.
MIN_CALIBRATION_ROWS = 1000
MIN_CLASS_ROWS = 10  # positives and negatives each: every half then holds both classes (AUC, isotonic ends)


class CalibrationDataError(ValueError):
    """The held-out rows cannot fit a calibrator: too few rows, or only one class."""


@dataclass(frozen=True)
class Calibrator:
    """A fitted calibration map from the net's logits to ctr; see the module docstring for the formulas."""

    method: str  # "isotonic" | "platt" | "none"
    negative_rate: float = 1.0  # w: the share of negatives training kept
    knots_x: tuple[float, ...] = ()  # isotonic: q at each knot, strictly increasing in [0, 1]
    knots_y: tuple[float, ...] = ()  # isotonic: ctr at each knot, non-decreasing in [0, 1]
    a: float = 1.0  # platt: slope on z + ln w
    b: float = 0.0  # platt: offset

    def __post_init__(self) -> None:
        _check(self)

    @property
    def log_rate(self) -> float:
        """ln w: added to the logit before the calibrator (0 without downsampling)."""
        return math.log(self.negative_rate)

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Isotonic only: (lo, hi, s, y_0), float64 (K-1,) each, with
        ctr = y_0 + sum_k s_k * (relu(q - lo_k) - relu(q - hi_k)), lo/hi the segments' ends and s their slopes.

        One knot (a constant map) gives one empty segment lo = hi = x_0 with slope 0.
        """
        x, y = np.asarray(self.knots_x, np.float64), np.asarray(self.knots_y, np.float64)
        if len(x) == 1:
            return x, x.copy(), np.zeros(1), float(y[0])
        return x[:-1], x[1:], np.diff(y) / np.diff(x), float(y[0])

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The float64 reference: logits z, shape (N,) or (N, 1) -> ctr, the same shape."""
        z = np.asarray(logits, dtype=np.float64)
        u = z + self.log_rate  # logit(q)
        if self.method == "platt":
            return _sigmoid(self.a * u + self.b)
        q = _sigmoid(u)
        if self.method == "none":
            return q
        lo, hi, slopes, y0 = self.segments()
        flat = q.reshape(-1, 1)  # (N, 1) - (K-1,) -> (N, K-1): how far q has climbed each segment
        climbed = np.maximum(flat - lo, 0.0) - np.maximum(flat - hi, 0.0)
        return (climbed @ slopes + y0).reshape(z.shape)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `from_dict` reads it back exactly."""
        return {
            "method": self.method,
            "negative_rate": self.negative_rate,
            "knots_x": list(self.knots_x),
            "knots_y": list(self.knots_y),
            "a": self.a,
            "b": self.b,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Calibrator:
        """The calibrator of `to_dict`'s output; other keys (a fit report beside it) are ignored.

        Raises:
            ValueError: naming the key that is missing, of the wrong type or out of range.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a calibrator is a JSON object, got {type(d).__name__}")
        if "method" not in d:
            raise ValueError(f"calibrator has no 'method' (keys: {sorted(d)})")
        return cls(
            method=d["method"],
            negative_rate=_number(d, "negative_rate", 1.0),
            knots_x=_numbers(d, "knots_x"),
            knots_y=_numbers(d, "knots_y"),
            a=_number(d, "a", 1.0),
            b=_number(d, "b", 0.0),
        )


def fit_calibrator(
    logits: np.ndarray,
    labels: np.ndarray,
    method: str = "auto",
    negative_rate: float = 1.0,
    max_knots: int = 32,
    *,
    source: str = "the held-out set",
) -> tuple[Calibrator, dict[str, Any]]:
    """Fit on the even-indexed held-out rows, report on the odd ones; `auto` keeps the lower report ECE; the
    calibrator returned is the chosen method fitted again on every row.

    Args:
        logits: the net's logits z on held-out rows, (N,) or (N, 1).
        labels: their 0/1 clicks, (N,) or (N, 1).
        method: one of METHODS.
        negative_rate: w, the share of negatives the run trained on (1 = no downsampling).
        max_knots: the most knots an isotonic fit keeps (>= 2).
        source: names the rows in error messages, e.g. "RUN/val_labels.npy".
    Returns:
        the calibrator (refit on all rows) and its report: method, chosen_by, fit_rows, report_rows, refit_rows,
        candidates {method: figures of the half fit}, before (figures of q) and after (figures of the chosen half
        fit's ctr) on the report half; figures are ece,
        calibration_ratio, logloss, auc (None with one class) and mean_predicted/observed.
    Raises:
        CalibrationDataError: too few rows, positives or negatives (not with method "none").
        ValueError: an unknown method, a bad negative_rate or max_knots, or logits/labels that do not match.
    """
    if method not in METHODS:
        raise ValueError(f"calibration method must be one of {METHODS}, got {method!r}")
    _check_rate(negative_rate)
    if not 2 <= max_knots <= MAX_KNOTS:
        raise ValueError(f"max_knots must be in [2, {MAX_KNOTS}], got {max_knots}")
    z, y = _rows(logits, labels, source)
    if method != "none":
        _check_enough(y, source)
    fit, rep = slice(0, None, 2), slice(1, None, 2)  # even / odd rows: deterministic, stratified by row order
    z_fit, y_fit, z_rep, y_rep = z[fit], y[fit], z[rep], y[rep]
    tried = ("isotonic", "platt") if method == "auto" else (method,)
    fitted = {m: _fit_one(m, z_fit, y_fit, negative_rate, max_knots) for m in tried}
    candidates = {m: _figures(y_rep, cal.apply(z_rep)) for m, cal in fitted.items()}
    chosen = min(tried, key=lambda m: _ece_key(candidates[m])) if method == "auto" else method
    # The method chosen, the served calibrator is fitted again on every held-out row: half the sampling noise
    # of the half fit. The figures stay the half fit's, on the half it never saw (an honest estimate).
    calibrator = _fit_one(chosen, z, y, negative_rate, max_knots) if chosen != "none" else fitted[chosen]
    report = {
        "method": chosen,
        "chosen_by": "lower ECE on the report half" if method == "auto" else "requested",
        "fit_rows": len(y_fit),
        "report_rows": len(y_rep),
        "refit_rows": len(y),
        "candidates": candidates,
        "before": _figures(y_rep, _sigmoid(z_rep + calibrator.log_rate)),
        "after": candidates[chosen],
    }
    return calibrator, report


class CalibratedNet(nn.Module):
    """features -> (ctr, raw_score), each (B, 1) float32: the served graph of a calibrated version.

    raw_score = sigmoid(net(x)) is the network's own probability; ctr is `calibrator` applied to the same logits,
    with the calibrator's constants in float32 and the op order of `Calibrator.apply`.
    """

    def __init__(self, net: nn.Module, calibrator: Calibrator) -> None:
        super().__init__()
        self.net = net
        self.head = calibration_head(calibrator)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the argument's name is the graph input's (torch.onnx's dynamic_shapes key), as in CTRProbability
        z = self.net(features)  # (B, F) -> (B, 1) logits
        raw = torch.sigmoid(z)
        return self.head(z), raw


def calibration_head(calibrator: Calibrator) -> nn.Module:
    """The module logits z (B, 1) -> ctr (B, 1) of one calibrator, float32, in `Calibrator.apply`'s op order."""
    if calibrator.method == "platt":
        return _PlattHead(calibrator)
    if calibrator.method == "isotonic":
        return _IsotonicHead(calibrator)
    return _RateHead(calibrator)


class _RateHead(nn.Module):
    """ctr = sigmoid(z + ln w): the downsampling correction alone (`none`)."""

    log_rate: torch.Tensor  # (1, 1) buffer

    def __init__(self, calibrator: Calibrator) -> None:
        super().__init__()
        self.shift = calibrator.negative_rate != 1.0
        self.register_buffer("log_rate", torch.tensor([[calibrator.log_rate]], dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        # w = 1: no Add; still a Sigmoid of its own, so ctr and raw_score are two tensors (two graph outputs)
        return torch.sigmoid(z + self.log_rate) if self.shift else torch.sigmoid(z)


class _PlattHead(nn.Module):
    """ctr = sigmoid(a * z + (a * ln w + b)): one Mul, one Add, one Sigmoid."""

    a: torch.Tensor  # (1, 1) buffer
    offset: torch.Tensor  # (1, 1) buffer

    def __init__(self, calibrator: Calibrator) -> None:
        super().__init__()
        offset = calibrator.a * calibrator.log_rate + calibrator.b  # folded in float64
        self.register_buffer("a", torch.tensor([[calibrator.a]], dtype=torch.float32))
        self.register_buffer("offset", torch.tensor([[offset]], dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(z * self.a + self.offset)


class _IsotonicHead(nn.Module):
    """ctr = (relu(q - lo) - relu(q - hi)) @ s + y_0 with q = sigmoid(z + ln w): Sub, Relu, MatMul, Add."""

    lo: torch.Tensor  # (1, K-1) buffer
    hi: torch.Tensor  # (1, K-1) buffer
    slopes: torch.Tensor  # (K-1, 1) buffer
    base: torch.Tensor  # (1, 1) buffer

    def __init__(self, calibrator: Calibrator) -> None:
        super().__init__()
        lo, hi, slopes, y0 = calibrator.segments()
        self.rate = _RateHead(calibrator)
        self.register_buffer("lo", torch.tensor(lo, dtype=torch.float32).reshape(1, -1))
        self.register_buffer("hi", torch.tensor(hi, dtype=torch.float32).reshape(1, -1))
        self.register_buffer("slopes", torch.tensor(slopes, dtype=torch.float32).reshape(-1, 1))
        self.register_buffer("base", torch.tensor([[y0]], dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        q = self.rate(z)  # (B, 1)
        # every term is in [0, s_k * (hi_k - lo_k)]: a sum without cancellation, so float32 stays near float64
        climbed = torch.relu(q - self.lo) - torch.relu(q - self.hi)  # (B, 1) - (1, K-1) -> (B, K-1)
        return climbed @ self.slopes + self.base  # (B, K-1) @ (K-1, 1) -> (B, 1)


def _fit_one(method: str, z: np.ndarray, y: np.ndarray, w: float, max_knots: int) -> Calibrator:
    u = z + math.log(w)
    if method == "platt":
        a, b = fit_platt(u, y)
        return Calibrator("platt", negative_rate=w, a=a, b=b)
    if method == "isotonic":
        kx, ky = fit_isotonic_knots(_sigmoid(u), y, max_knots)
        return Calibrator("isotonic", negative_rate=w, knots_x=kx, knots_y=ky)
    return Calibrator("none", negative_rate=w)


def _figures(y: np.ndarray, p: np.ndarray) -> dict[str, Any] | None:
    """ECE, calibration ratio, log loss and AUC of probabilities p on rows y; None for no rows."""
    if len(y) == 0:
        return None
    positives = int(y.sum())
    return {
        "ece": expected_calibration_error(y, p),
        "calibration_ratio": calibration_ratio(y, p),
        "logloss": log_loss(y, p),
        "auc": roc_auc(y, p) if 0 < positives < len(y) else None,
        "mean_predicted": float(p.mean()),
        "observed": float(y.mean()),
    }


def _ece_key(figures: dict[str, Any] | None) -> float:
    return math.inf if figures is None else float(figures["ece"])


def _sigmoid(t: np.ndarray) -> np.ndarray:
    # exp of a negative argument only: no overflow for |t| large
    e = np.exp(-np.abs(t))
    return np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _rows(logits: np.ndarray, labels: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    for name, arr in (("logits", z), ("labels", y)):
        if arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape[1] != 1):
            raise ValueError(f"calibration {name} of {source} must be (N,) or (N, 1), got {arr.shape}")
    z, y = z.reshape(-1), y.reshape(-1)
    if z.shape != y.shape:
        raise ValueError(f"{source} has {len(z)} logits but {len(y)} labels")
    if not np.isfinite(z).all():
        bad = int(np.flatnonzero(~np.isfinite(z))[0])
        raise ValueError(f"{source} has a non-finite logit {z[bad]} at row {bad}")
    not_binary = np.flatnonzero((y != 0) & (y != 1))
    if len(not_binary):
        raise ValueError(
            f"{source} has label {y[not_binary[0]]} at row {int(not_binary[0])}; expected 0 or 1"
        )
    return z, y


def _check_enough(y: np.ndarray, source: str) -> None:
    rows, pos = len(y), int(y.sum())
    neg = rows - pos
    if rows < MIN_CALIBRATION_ROWS or pos < MIN_CLASS_ROWS or neg < MIN_CLASS_ROWS:
        raise CalibrationDataError(
            f"{source} has {rows} rows, {pos} positives, {neg} negatives; fitting a calibrator needs at least "
            f"{MIN_CALIBRATION_ROWS} rows with {MIN_CLASS_ROWS} positives and {MIN_CLASS_ROWS} negatives; "
            "give more held-out rows (e.g. a larger --val-fraction) or --calibration none"
        )


def _check_rate(w: Any) -> None:
    if not isinstance(w, int | float) or isinstance(w, bool) or not 0.0 < w <= 1.0:
        raise ValueError(f"negative_rate must be a number in (0, 1], got {w!r}")


def _check(c: Calibrator) -> None:
    """Validate a calibrator's fields; ValueError names the first bad one."""
    if c.method not in FITTED_METHODS:
        hint = " (auto resolves to one of them at fit)" if c.method == "auto" else ""
        raise ValueError(f"calibrator method must be one of {FITTED_METHODS}, got {c.method!r}{hint}")
    _check_rate(c.negative_rate)
    if c.method != "isotonic" and (c.knots_x or c.knots_y):
        raise ValueError(f"a {c.method} calibrator has no knots, got {len(c.knots_x)} knots_x")
    if c.method != "platt" and (c.a, c.b) != (1.0, 0.0):
        raise ValueError(f"a {c.method} calibrator has a = 1 and b = 0, got a = {c.a}, b = {c.b}")
    if c.method == "platt":
        lo, hi = PLATT_SLOPE_RANGE
        if not lo <= c.a <= hi or not math.isfinite(c.b):
            raise ValueError(
                f"platt calibrator needs a in [{lo}, {hi}] and a finite b, got a = {c.a}, b = {c.b}"
            )
    if c.method == "isotonic":
        check_knots(c.knots_x, c.knots_y)


def _number(d: dict[str, Any], key: str, default: float) -> float:
    v = d.get(key, default)
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise ValueError(f"calibrator {key!r} must be a number, got {v!r}")
    return float(v)


def _numbers(d: dict[str, Any], key: str) -> tuple[float, ...]:
    v = d.get(key, [])
    if not isinstance(v, list | tuple) or not all(
        isinstance(t, int | float) and not isinstance(t, bool) for t in v
    ):
        raise ValueError(f"calibrator {key!r} must be a list of numbers, got {v!r}")
    return tuple(float(t) for t in v)
