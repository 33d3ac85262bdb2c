"""The two calibration fits in numpy: Platt's (a, b) by Newton's method, and isotonic knots by PAV.

ctr_model/calibration.py holds the calibrator they make; these are its fitting arithmetic.
"""

from __future__ import annotations

import numpy as np

# The most an isotonic map may rise per unit of q: a slope times float32's rounding of q (6e-8) is its share of
# the graph's error. A trained net's calibration curve is far flatter (about 1 to 2); noisy small fits reach 7.
MAX_SLOPE = 10.0
# sum_k s_k * (1 - x_k) over the segments: times float32's epsilon (6e-8), about the worst rounding of
# y_0 + sum_k s_k * (relu(q - x_k) - relu(q - x_k+1)); 32 keeps it near 2e-6. Fits of 1000 rows reach about 20.
MAX_SEGMENT_MASS = 32.0
# Platt's slope a: below 0.05 the net's ranking is all but ignored, above 10 the map is a near step whose float32
# graph drifts (its derivative is a / 4) and the fit is separating the rows rather than calibrating them.
PLATT_SLOPE_RANGE = (0.05, 10.0)
MAX_KNOTS = 256  # the most knots a calibrator may hold; fit_calibrator's default is 32
_CHUNK_ROWS = 65_536
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


def segment_mass(x: np.ndarray, y: np.ndarray) -> float:
    """sum_k s_k * (1 - x_k) of knots (x, y): the scale of the float32 rounding of the isotonic map."""
    if len(x) < 2:
        return 0.0
    return float((np.diff(y) / np.diff(x)) @ (1.0 - x[:-1]))


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

    1. PAV: the isotonic fit of the labels sorted by q (tied q pooled first), a step function.
    2. Knots at q's quantiles (1/2K to 1 - 1/2K of the rows), and the monotone
       piecewise-linear function through them closest to the PAV fit in row-weighted least squares (NNLS on
       the rises). Its free intercept keeps the mean: the map predicts as many clicks as the rows had.
    3. While a segment is steeper than MAX_SLOPE, or the segment mass exceeds MAX_SEGMENT_MASS, drop an inner
       end of the steepest segment (the one that leaves the flatter merged segment) and refit.
    """
    uq, inverse, counts = np.unique(q, return_inverse=True, return_counts=True)
    w = counts.astype(np.float64)
    fitted = pool_adjacent_violators(np.bincount(inverse, weights=y) / w, w)  # per distinct q
    share = (np.cumsum(w) - w / 2) / w.sum()  # each distinct q's mid-rank share in (0, 1)
    # the end knots a half block in: the flat ends then hold rows, which pin the end values (no overshoot)
    edge = 0.5 / max_knots
    knots = np.unique(np.interp(np.linspace(edge, 1.0 - edge, max_knots), share, uq))
    knots = _spaced(knots)
    while True:
        values = _monotone_fit(uq, fitted, w, knots)
        k = _worst_knot(knots, values)
        if k is None:
            knots, values = _without_collinear(knots, values)
            return tuple(knots.tolist()), tuple(values.tolist())
        knots = np.delete(knots, k)


def _spaced(knots: np.ndarray) -> np.ndarray:
    """Drop knots closer than _MIN_KNOT_GAP to the previous kept one (the last knot is always kept)."""
    kept = [float(knots[0])]
    for x in knots[1:].tolist():
        if x - kept[-1] >= _MIN_KNOT_GAP:
            kept.append(x)
    if len(kept) > 1 and knots[-1] != kept[-1]:
        kept[-1] = float(knots[-1])
    return np.asarray(kept)


def _without_collinear(knots: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop inner knots where the slope does not change (a flat run of knots is one segment): a smaller graph."""
    if len(knots) > 1 and values[-1] - values[0] <= 1e-9:  # a constant map (up to rounding): one knot
        return knots[:1], np.array([float(values.mean())])
    if len(knots) < 3:
        return knots, values
    slopes = np.diff(values) / np.diff(knots)
    bend = np.abs(np.diff(slopes)) > 1e-9 * np.maximum(1.0, np.abs(slopes[1:]))
    keep = np.concatenate(([True], bend, [True]))
    return knots[keep], values[keep]


def _ramps(u: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """(N, K-1): how far each u has climbed each segment, 0 below it, 1 above it."""
    return np.clip((u[:, None] - knots[:-1]) / np.diff(knots), 0.0, 1.0)


def _monotone_fit(u: np.ndarray, target: np.ndarray, w: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Values at `knots` of the non-decreasing piecewise-linear f minimising sum w * (f(u) - target)^2."""
    mean_t = float(np.average(target, weights=w))
    if len(knots) == 1:
        return np.array([mean_t])
    k = len(knots) - 1
    sum_a, sum_at, gram = np.zeros(k), np.zeros(k), np.zeros((k, k))
    for start in range(0, len(u), _CHUNK_ROWS):  # (chunk, K-1) ramps at a time: memory stays O(chunk * K)
        part = slice(start, start + _CHUNK_ROWS)
        a = _ramps(u[part], knots)
        wa = a * w[part, None]
        sum_a += wa.sum(axis=0)
        sum_at += wa.T @ target[part]
        gram += wa.T @ a
    total = float(w.sum())
    mean_a = sum_a / total
    # centred (the intercept is free, the rises are >= 0): sum w (a - mean_a)(a - mean_a)' and sum w (a - mean_a) t
    rises = nnls_gram(gram - total * np.outer(mean_a, mean_a), sum_at - total * mean_a * mean_t)
    values = mean_t - float(mean_a @ rises) + np.concatenate(([0.0], np.cumsum(rises)))
    return np.maximum.accumulate(np.clip(values, 0.0, 1.0))


def _worst_knot(knots: np.ndarray, values: np.ndarray) -> int | None:
    """The knot to drop, or None when every slope and the hinge mass are within bounds."""
    if len(knots) < 2:
        return None
    slopes = np.diff(values) / np.diff(knots)
    if slopes.max() <= MAX_SLOPE and segment_mass(knots, values) <= MAX_SEGMENT_MASS:
        return None
    if len(knots) == 2:
        return 1  # one flat value: the mean
    k = int(np.argmax(slopes))  # the steepest segment [k, k+1]: drop the inner end whose removal is flatter
    inner = [j for j in (k, k + 1) if 0 < j < len(knots) - 1]
    if not inner:  # never: three knots or more always leave one inner end
        return k
    return min(inner, key=lambda j: (values[j + 1] - values[j - 1]) / (knots[j + 1] - knots[j - 1]))


def nnls_gram(gram: np.ndarray, h: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """argmin_{x >= 0} x' G x / 2 - h' x (Lawson and Hanson's active set), from the Gram matrix G = A'A, h = A'b."""
    n = len(h)
    x = np.zeros(n)
    free = np.zeros(n, dtype=bool)
    scale = tol * max(1.0, float(np.abs(h).max(initial=0.0)))
    for _ in range(3 * n + 10):
        grad = h - gram @ x
        if free.all() or grad[~free].max() <= scale:
            break
        free[np.flatnonzero(~free)[np.argmax(grad[~free])]] = True
        while True:
            s = np.zeros(n)
            idx = np.flatnonzero(free)
            s[idx] = np.linalg.lstsq(gram[np.ix_(idx, idx)], h[idx], rcond=None)[0]
            if (s[idx] > 0).all():
                x = s
                break
            neg = idx[s[idx] <= 0]
            alpha = float(np.min(x[neg] / (x[neg] - s[neg])))
            x = x + alpha * (s - x)
            free &= x > tol
            x[~free] = 0.0
    return x


def check_knots(kx: tuple[float, ...], ky: tuple[float, ...]) -> None:
    if not 1 <= len(kx) <= MAX_KNOTS or len(kx) != len(ky):
        raise ValueError(
            f"isotonic calibrator needs 1 to {MAX_KNOTS} knots with as many y as x, got {len(kx)} x and {len(ky)} y"
        )
    """Raise ValueError unless the knots make a monotone map on [0, 1] that float32 graphs compute to 1e-5."""
    x, y = np.asarray(kx, np.float64), np.asarray(ky, np.float64)
    for name, v in (("knots_x", x), ("knots_y", y)):
        if not (np.isfinite(v).all() and (v >= 0).all() and (v <= 1).all()):
            raise ValueError(f"isotonic {name} must lie in [0, 1], got {v.tolist()}")
    dx, dy = np.diff(x), np.diff(y)
    if (dx <= 0).any():
        k = int(np.flatnonzero(dx <= 0)[0])
        raise ValueError(f"isotonic knots_x must increase strictly, got {x[k]} then {x[k + 1]} at knot {k}")
    if (dy < 0).any():
        k = int(np.flatnonzero(dy < 0)[0])
        raise ValueError(f"isotonic knots_y must not decrease, got {y[k]} then {y[k + 1]} at knot {k}")
    steep = np.flatnonzero(dy > MAX_SLOPE * dx * (1 + 1e-9))
    if len(steep):
        k = int(steep[0])
        raise ValueError(
            f"isotonic slope {dy[k] / dx[k]:.4g} between knots {k} and {k + 1} exceeds {MAX_SLOPE} "
            "(float32 graphs would drift from the reference)"
        )
    mass = segment_mass(x, y)
    if mass > MAX_SEGMENT_MASS * (1 + 1e-9):
        raise ValueError(
            f"isotonic knots have segment mass sum_k s_k * (1 - x_k) = {mass:.4g} above {MAX_SEGMENT_MASS} "
            "(float32 graphs would drift from the reference)"
        )
