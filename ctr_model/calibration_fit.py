"""The two calibration fits in numpy: Platt's (a, b) by Newton's method, and isotonic knots by PAV.

ctr_model/calibration.py holds the calibrator they make; these are its fitting arithmetic.
"""

from __future__ import annotations

import numpy as np

# The most an isotonic map may rise per unit of q. The float32 graph's error is about the slopes' total
# variation times float32's epsilon (6e-8), so 10 keeps it near 1e-6, under the 1e-5 parity tolerance. A
# calibration curve of a trained net is far flatter (about 1 to 2); only a few noisy knots are ever this steep.
MAX_SLOPE = 10.0
# Platt's slope a: below 0.05 the net's ranking is all but ignored, above 10 the map is a near step whose float32
# graph drifts (its derivative is a / 4) and the fit is separating the rows rather than calibrating them.
PLATT_SLOPE_RANGE = (0.05, 10.0)
_MIN_KNOT_GAP = 1e-6  # knots closer than this could coincide in float32


def fit_platt(u: np.ndarray, y: np.ndarray, iters: int = 100) -> tuple[float, float]:
    """(a, b) minimising the mean log loss of sigmoid(a * u + b) on labels y; a clipped to PLATT_SLOPE_RANGE.

    Newton's method with step halving from (1, 0); converges in under ten steps on calibration data.
    """
    a, b = _newton(u, y, np.array([1.0, 0.0]), iters, fix_a=False)
    lo, hi = PLATT_SLOPE_RANGE
    if not lo <= a <= hi:  # clip the slope, then the best offset for it
        a = float(np.clip(a, lo, hi))
        a, b = _newton(u, y, np.array([a, b]), iters, fix_a=True)
    return a, b


def _loss(u: np.ndarray, y: np.ndarray, theta: np.ndarray) -> float:
    t = theta[0] * u + theta[1]
    return float(np.mean(np.logaddexp(0.0, t) - y * t))  # log loss of sigmoid(t), stable for any t


def _newton(u: np.ndarray, y: np.ndarray, theta: np.ndarray, iters: int, fix_a: bool) -> tuple[float, float]:
    loss = _loss(u, y, theta)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(theta[0] * u + theta[1], -40, 40)))
        r, s = p - y, p * (1.0 - p)
        if fix_a:
            step = np.array([0.0, r.mean() / max(s.mean(), 1e-12)])
        else:
            grad = np.array([(r * u).mean(), r.mean()])
            hess = np.array([[(s * u * u).mean(), (s * u).mean()], [(s * u).mean(), s.mean()]])
            step = np.linalg.solve(hess + 1e-12 * np.eye(2), grad)
        t = 1.0
        while t > 1e-8:  # halve the step until the loss does not rise
            trial = theta - t * step
            trial_loss = _loss(u, y, trial)
            if trial_loss <= loss:
                break
            t /= 2
        else:
            break
        done = np.abs(trial - theta).max() < 1e-10
        theta, loss = trial, trial_loss
        if done:
            break
    return float(theta[0]), float(theta[1])


def pool_adjacent_violators(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing fit of `values` (in their order) minimising the weighted squared error."""
    means: list[float] = []
    sizes: list[float] = []
    counts: list[int] = []
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        means.append(v)
        sizes.append(w)
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:  # merge the violating pair into one block
            w2, w1 = sizes.pop(), sizes[-1]
            m2, n2 = means.pop(), counts.pop()
            means[-1] = (means[-1] * w1 + m2 * w2) / (w1 + w2)
            sizes[-1] = w1 + w2
            counts[-1] += n2
    return np.repeat(np.asarray(means), counts)


def fit_isotonic_knots(
    q: np.ndarray, y: np.ndarray, max_knots: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Knots (x, y) of a monotone piecewise-linear map q -> P(click), at most `max_knots`, slopes <= MAX_SLOPE.

    PAV on the labels sorted by q (tied q pooled first), then max_knots blocks of equal row count: each knot
    is its block's mean q and mean fitted rate (monotone, since the PAV fit is). Knots closer than
    _MIN_KNOT_GAP or joined by a slope above MAX_SLOPE are merged (row-weighted) until none is.
    """
    uq, inverse, counts = np.unique(q, return_inverse=True, return_counts=True)
    rate = np.bincount(inverse, weights=y) / counts  # click rate per distinct q
    fitted = pool_adjacent_violators(rate, counts.astype(np.float64))
    blocks = np.minimum((np.cumsum(counts) - counts) * max_knots // counts.sum(), max_knots - 1)
    n = np.bincount(blocks, weights=counts)
    keep = n > 0
    xs = (np.bincount(blocks, weights=uq * counts)[keep] / n[keep]).tolist()
    ys = (np.bincount(blocks, weights=fitted * counts)[keep] / n[keep]).tolist()
    ws = n[keep].tolist()
    _merge_steep(xs, ys, ws)
    ys = np.maximum.accumulate(np.clip(ys, 0.0, 1.0)).tolist()  # exact monotone after float sums
    return tuple(xs), tuple(ys)


def _merge_steep(xs: list[float], ys: list[float], ws: list[float]) -> None:
    """Merge, in place, the steepest (or too close) adjacent pair of knots until every gap is acceptable."""
    while len(xs) > 1:
        x, y = np.asarray(xs), np.asarray(ys)
        dx, dy = np.diff(x), np.diff(y)
        badness = np.where(dx < _MIN_KNOT_GAP, np.inf, dy / np.maximum(dx, _MIN_KNOT_GAP))
        k = int(np.argmax(badness))
        if badness[k] <= MAX_SLOPE * (1 - 1e-9):
            return
        w = ws[k] + ws[k + 1]
        xs[k] = (xs[k] * ws[k] + xs[k + 1] * ws[k + 1]) / w
        ys[k] = (ys[k] * ws[k] + ys[k + 1] * ws[k + 1]) / w
        ws[k] = w
        del xs[k + 1], ys[k + 1], ws[k + 1]
