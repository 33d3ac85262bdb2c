"""The synthetic world's ground-truth click probability: the oracle no model can beat.

The logit mixes main effects of log counts, missingness, a few informative categorical fields, a
numeric×numeric interaction, a threshold effect and categorical×numeric and categorical×categorical
interactions, so a linear model falls short of it and an MLP can get close. Coefficients come from a
fixed world seed: every data seed samples rows from the same world.

The world drifts continuously in the day (`GroundTruth(day=D)`, D may be a fraction: 2.25 is 06:00 on day 2;
day 0 is today's world, unchanged by the drift). `drift_scale` K multiplies the drift's speed: the world of
day D under scale K is the world of day K*D under scale 1 (`effective_day`).
- the click model: every coefficient turns from its day-0 value towards an independent second draw,
  w(d) = cos(a d) w0 + sin(a d) w1 with a = CLICK_DRIFT_RAD_PER_DAY, so the coefficients' spread stays put
  and their correlation with day 0 is cos(a d) (0.83 on day 5);
- the inputs (applied by `training.synth.sample_rows`): NUMERIC_DRIFT moves the log-scale median of a few
  counts; CATEGORICAL_DRIFT brings new values to the top of some categorical fields every day, so values
  never seen before appear and the values that were popular fade.
"""

from __future__ import annotations

import numpy as np

WORLD_SEED = 20260
# Per numeric field: (log-scale median, log-scale spread, missing rate), shaped on the Kaggle data.
NUMERIC_SHAPE = (
    (1.0, 1.2, 0.45),
    (1.6, 1.9, 0.0),
    (2.0, 1.3, 0.21),
    (1.6, 0.9, 0.22),
    (7.6, 1.8, 0.03),
    (3.2, 1.6, 0.22),
    (1.3, 1.3, 0.04),
    (2.0, 1.0, 0.001),
    (3.6, 1.3, 0.04),
    (0.4, 0.5, 0.45),
    (0.8, 0.8, 0.04),
    (0.3, 0.9, 0.77),
    (1.6, 1.0, 0.22),
)
# Per categorical field C1..C26: (vocabulary size, Zipf exponent, missing rate).
CATEGORICAL_SHAPE = (
    (1400, 1.3, 0.0),
    (550, 1.1, 0.0),
    (200_000, 1.05, 0.03),
    (100_000, 1.05, 0.03),
    (300, 1.4, 0.0),
    (14, 1.2, 0.12),
    (12_000, 1.1, 0.0),
    (630, 1.3, 0.0),
    (3, 1.5, 0.0),
    (40_000, 1.05, 0.0),
    (5_500, 1.1, 0.0),
    (150_000, 1.05, 0.03),
    (3_200, 1.1, 0.0),
    (25, 1.2, 0.0),
    (14_000, 1.1, 0.0),
    (120_000, 1.05, 0.03),
    (10, 1.2, 0.0),
    (5_600, 1.1, 0.0),
    (2_100, 1.2, 0.44),
    (4, 1.1, 0.44),
    (150_000, 1.05, 0.03),
    (15, 1.4, 0.76),
    (15, 1.2, 0.0),
    (60_000, 1.05, 0.03),
    (80, 1.3, 0.44),
    (50_000, 1.05, 0.44),
)
# Fields whose values move the click rate: (0-based categorical index, effect spread, values with an effect).
INFORMATIVE = ((8, 0.6, 3), (19, 0.5, 4), (16, 0.5, 10), (5, 0.45, 14), (13, 0.35, 25), (22, 0.35, 15))
TARGET_POSITIVE_RATE = 0.25
CLICK_DRIFT_RAD_PER_DAY = 0.12
# 0-based numeric index -> shift of its log-scale median per day, in units of its log-scale spread (I3, I5, I7).
NUMERIC_DRIFT = {2: 0.12, 4: -0.12, 6: 0.12}
# 0-based categorical index -> new values per day (C2, C3, C4, C7, C10, C12, C16, C21, C24, C26). Each day k
# values never seen before arrive at the top of the field's popularity ranking, and every older value moves
# k ranks down: on day d the k*d most popular values are new ones and day 0's favourites fade.
CATEGORICAL_DRIFT = {1: 1, 2: 1, 3: 1, 6: 1, 9: 1, 11: 1, 15: 1, 20: 1, 23: 1, 25: 1}


def effective_day(day: float, drift_scale: float = 1.0) -> float:
    """The day of the scale-1 world that day `day` under `drift_scale` looks like; an int for whole days."""
    if day < 0 or drift_scale < 0:
        raise ValueError(f"day and drift scale must be >= 0, got day {day} and drift scale {drift_scale}")
    d = day * drift_scale
    return int(d) if float(d).is_integer() else float(d)


def numeric_shift(day: float) -> np.ndarray:
    """Shift of each numeric field's log-scale median on `day`, in log units: float [13]."""
    shift = np.zeros(len(NUMERIC_SHAPE))
    for j, per_day in NUMERIC_DRIFT.items():
        shift[j] = per_day * NUMERIC_SHAPE[j][1] * day
    return shift


def value_ids(ranks: np.ndarray, day: float) -> np.ndarray:
    """Day `day`'s popularity ranks [N, 26] (-1 = missing) -> value ids, the identity hashed into a string.

    On day 0 a value's id is its rank. A drifting field with k new values a day has had n = floor(k*day)
    arrivals (one every 1/k day, so a fraction of a day counts its arrivals so far); rank r < n is the value
    that arrived (r+1)-th most recently, id vocabulary size + n - 1 - r (never seen on day 0), and rank r >= n is
    the day-0 value of rank r - n. (For whole days and k = 1 these are the ids the day-by-day world had.)
    """
    ids = ranks.copy()
    for j, k in CATEGORICAL_DRIFT.items():
        r, fresh = ranks[:, j], int(np.floor(k * day + 1e-9))
        if fresh == 0:
            continue
        new_id = CATEGORICAL_SHAPE[j][0] + fresh - 1 - r
        ids[:, j] = np.where(r < 0, -1, np.where(r >= fresh, r - fresh, new_id))
    return ids


class GroundTruth:
    """Deterministic click model of one day; `logit(numeric, cat_index)` scores generated rows."""

    def __init__(self, day: float = 0) -> None:
        if day < 0:
            raise ValueError(f"day must be >= 0, got {day}")
        self.day = day
        rng = np.random.default_rng(WORLD_SEED)
        self.w_num = rng.normal(0.0, 0.35, size=13)
        self.w_missing = rng.normal(0.0, 0.3, size=13)
        self.cat_effects = {f: rng.normal(0.0, s, size=k) for f, s, k in INFORMATIVE}
        self.c9_slope = rng.normal(0.0, 0.4, size=3)  # C9 value changes the slope of I7
        self.bias = 0.0
        if day:  # day 0 draws nothing more, so today's world is exactly the undrifted one
            far = np.random.default_rng(WORLD_SEED + 2)  # where the coefficients drift to
            c, s_ = np.cos(CLICK_DRIFT_RAD_PER_DAY * day), np.sin(CLICK_DRIFT_RAD_PER_DAY * day)
            self.w_num = c * self.w_num + s_ * far.normal(0.0, 0.35, size=13)
            self.w_missing = c * self.w_missing + s_ * far.normal(0.0, 0.3, size=13)
            self.cat_effects = {
                f: c * self.cat_effects[f] + s_ * far.normal(0.0, s, size=k) for f, s, k in INFORMATIVE
            }
            self.c9_slope = c * self.c9_slope + s_ * far.normal(0.0, 0.4, size=3)

    def logit(self, numeric: np.ndarray, cat_index: np.ndarray) -> np.ndarray:
        """Ground-truth logit.

        Args:
            numeric: float [N, 13] counts, NaN where missing.
            cat_index: int [N, 26] Zipf rank of each categorical value, -1 where missing.
        Returns:
            float64 [N] logits.
        """
        med = np.array([m for m, _, _ in NUMERIC_SHAPE])
        spread = np.array([s for _, s, _ in NUMERIC_SHAPE])
        missing = np.isnan(numeric)
        z = np.where(missing, 0.0, (np.log1p(np.abs(np.nan_to_num(numeric))) - med) / spread)
        out = self.bias + z @ self.w_num + missing @ self.w_missing
        out += 0.45 * z[:, 0] * z[:, 2]  # I1 x I3
        out += 0.6 * np.maximum(z[:, 4] - 0.5, 0.0)  # threshold on I5
        out -= 0.25 * z[:, 5] ** 2
        for f in self.cat_effects:
            out += self._effect(cat_index, f)
        c9 = cat_index[:, 8]
        out += np.where(c9 >= 0, self.c9_slope[np.clip(c9, 0, 2)], 0.0) * z[:, 6]
        out += 0.8 * self._effect(cat_index, 5) * self._effect(cat_index, 16)  # C6 x C17 amplify each other
        return out

    def _effect(self, cat_index: np.ndarray, f: int) -> np.ndarray:
        """Main effect of categorical field f per row; 0 for missing values and values without an effect."""
        effects, idx = self.cat_effects[f], cat_index[:, f]
        known = (idx >= 0) & (idx < effects.size)
        return np.where(known, effects[np.clip(idx, 0, effects.size - 1)], 0.0)

    def calibrate(self, numeric: np.ndarray, cat_index: np.ndarray) -> None:
        """Set the bias so the mean click probability on this sample is the target positive rate."""
        base = self.logit(numeric, cat_index) - self.bias
        lo, hi = -10.0, 10.0
        for _ in range(50):  # bisection: the mean sigmoid is monotone in the bias
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _sigmoid(base + mid).mean() < TARGET_POSITIVE_RATE else (lo, mid)
        self.bias = (lo + hi) / 2


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
