"""A rollout policy: the steps a new version takes, the shares of traffic in each, and the test that promotes it.

Read from a JSON file (`--policy`), then overridden by the flags. Every key is optional:

    {"steps": ["shadow", "canary", "stable"], "shadow_percent": 10, "canary_percent": 10, "min_rows": 500,
     "auc_margin": 0.01, "confidence": 0.95, "calibration_bound": 0.1, "calibration_z": 3,
     "load_timeout_s": 120, "keep_previous": true}

The test a candidate passes to move on, from the live evaluator's figures (STATE/snapshot.json): for the
candidate's rows in its step (label `shadow` or `canary`) and stable's rows (label `stable`), each with at
least `min_rows` joined rows:

- d = AUC(candidate) - AUC(stable), its variance var_c + var_s (DeLong's variance of each AUC; the two sets
  of rows are treated as independent, which overstates the variance when they share requests, as shadow rows
  do: the test is then conservative); z = the standard normal quantile of `confidence`;
- **promote** when the lower bound d - z sqrt(var) > -auc_margin (not worse than stable by more than the
  margin, at that one-sided confidence) and the candidate's calibration ratio lies in [1 - b, 1 + b];
- **roll back** as soon as the upper bound d + z sqrt(var) < -auc_margin (significantly worse), or the
  candidate's calibration ratio lies outside [1 - b, 1 + b] by more than chance: |z| > calibration_z for
  z = (observed - predicted) / sqrt(predicted (1 - predicted / rows)), the clicks' standard deviation were the
  scores right (an upper bound of sum p (1 - p)); a ratio of a few dozen clicks strays 10 % by chance alone;
- otherwise wait for more rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

SNAPSHOT = "snapshot.json"
STEPS = ("shadow", "canary", "stable")  # the order a version moves in; "stable" is always the last


class PolicyError(ValueError):
    """The policy file or a flag is not a valid policy; the message names the key and the fix."""


@dataclass(frozen=True)
class Policy:
    """How every candidate of one model is rolled out."""

    steps: tuple[str, ...] = STEPS
    shadow_percent: float = 10.0  # share of unlabelled requests also scored by the candidate in "shadow"
    canary_percent: float = 10.0  # share of unlabelled requests answered by the candidate in "canary"
    min_rows: int = 500  # joined rows the candidate and stable each need before a figure is judged
    auc_margin: float = 0.01  # the candidate may be this much below stable's AUC and still be "not worse"
    confidence: float = 0.95  # of the one-sided interval on AUC(candidate) - AUC(stable)
    calibration_bound: float = 0.1  # the candidate's calibration ratio must lie in [1 - b, 1 + b]
    calibration_z: float = 3.0  # ...and is rolled back outside it only when its clicks' z-score passes this
    load_timeout_s: float = 120.0  # a candidate not AVAILABLE this long after it was listed is rolled back
    keep_previous: bool = True  # keep the previous stable version loaded (the server's fallback)

    def next_step(self, step: str) -> str:
        """The policy's step after `step` ("load" comes before every step; a step the policy no longer has
        is followed by the policy's next one in the order shadow, canary, stable)."""
        order = ("load", *STEPS)
        return next(s for s in self.steps if order.index(s) > order.index(step))

    def check(self) -> Policy:
        """Return self when every value is usable; PolicyError naming the first that is not."""
        steps = list(self.steps)
        if (
            not steps
            or any(s not in STEPS for s in steps)
            or steps != sorted(set(steps), key=STEPS.index)
            or steps[-1] != "stable"
        ):
            raise PolicyError(
                f"steps {list(self.steps)} must be a subsequence of {list(STEPS)} ending in 'stable'"
            )
        for key in ("shadow_percent", "canary_percent"):
            value = getattr(self, key)
            if not 0 <= value <= 100:
                raise PolicyError(f"{key} {value} must be within [0, 100]")
            step = key.split("_")[0]
            if step in self.steps and value == 0:
                raise PolicyError(f"{key} is 0 while steps include {step!r}: the step would never see a row")
        if self.min_rows < 1:
            raise PolicyError(f"min_rows {self.min_rows} must be at least 1")
        if not 0 <= self.auc_margin < 1:
            raise PolicyError(f"auc_margin {self.auc_margin} must be within [0, 1)")
        if not 0.5 <= self.confidence < 1:
            raise PolicyError(f"confidence {self.confidence} must be within [0.5, 1)")
        if not 0 < self.calibration_bound < 1:
            raise PolicyError(f"calibration_bound {self.calibration_bound} must be within (0, 1)")
        if self.calibration_z < 0:
            raise PolicyError(f"calibration_z {self.calibration_z} must be at least 0")
        if self.load_timeout_s <= 0:
            raise PolicyError(f"load_timeout_s {self.load_timeout_s} must be positive")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


def load_policy(path: Path | None, overrides: dict[str, Any]) -> Policy:
    """The policy of `path` (None: the defaults) with the non-None `overrides` applied, checked."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise PolicyError(f"cannot read the policy {path}: {exc}") from exc
        if not isinstance(values, dict):
            raise PolicyError(f"the policy {path} must be a JSON object")
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name: f for f in fields(Policy)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise PolicyError(f"unknown policy keys {unknown}; known: {sorted(known)}")
    policy = Policy()
    try:
        for key, value in values.items():
            default = getattr(policy, key)
            if isinstance(default, tuple):
                if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
                    raise PolicyError(f"steps must be a list of step names, not {value!r}")
                value = tuple(value)
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise PolicyError(f"{key} must be true or false, not {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise PolicyError(f"{key} must be a number, not {value!r}")
            else:
                value = type(default)(value)
            policy = replace(policy, **{key: value})
    except (TypeError, ValueError) as exc:
        if isinstance(exc, PolicyError):
            raise
        raise PolicyError(str(exc)) from exc
    return policy.check()


@dataclass(frozen=True)
class Verdict:
    """What the figures say: "promote", "rollback" or "wait", why, and the figures it was judged on."""

    action: str
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


def read_snapshot(eval_state: Path) -> dict[str, Any] | None:
    """The evaluator's newest snapshot (None: none yet, or unreadable: it is replaced atomically)."""
    try:
        snapshot = json.loads((eval_state / SNAPSHOT).read_text())
    except (OSError, ValueError):
        return None
    return snapshot if isinstance(snapshot, dict) and isinstance(snapshot.get("figures"), list) else None


def figure(snapshot: dict[str, Any] | None, model: str, version: int, label: str) -> dict[str, Any] | None:
    """The snapshot's figures of (model, version, label), or None."""
    for f in (snapshot or {}).get("figures", []):
        try:
            if f.get("model") == model and int(f.get("version")) == version and f.get("label") == label:
                return dict(f)
        except (TypeError, ValueError):
            continue
    return None


def _enough(f: dict[str, Any] | None, policy: Policy, *keys: str) -> bool:
    return (
        f is not None
        and int(f.get("rows") or 0) >= policy.min_rows
        and all(isinstance(f.get(k), int | float) and math.isfinite(f[k]) for k in keys)
    )


def calibration_z(f: dict[str, Any]) -> float:
    """(observed - predicted clicks) / their standard deviation were the scores right (inf: no spread)."""
    rows, observed = float(f.get("rows") or 0), float(f.get("positives") or 0)
    predicted = f.get("predicted")
    predicted = (
        float(predicted) if isinstance(predicted, int | float) else float(f["calibration_ratio"]) * observed
    )
    var = predicted * (1 - predicted / rows) if rows else 0.0
    gap = observed - predicted
    return gap / math.sqrt(var) if var > 0 else (0.0 if gap == 0 else math.copysign(math.inf, gap))


def judge(candidate: dict[str, Any] | None, stable: dict[str, Any] | None, policy: Policy) -> Verdict:
    """The verdict on the candidate's figures against stable's (either None: not in the snapshot)."""
    figures: dict[str, Any] = {"candidate": candidate, "stable": stable}
    low, high = 1 - policy.calibration_bound, 1 + policy.calibration_bound
    if not _enough(candidate, policy, "auc", "auc_var", "calibration_ratio"):
        rows = 0 if candidate is None else int(candidate.get("rows") or 0)
        return Verdict("wait", f"candidate has {rows} of {policy.min_rows} joined rows with figures", figures)
    assert candidate is not None
    ratio, cal_z = float(candidate["calibration_ratio"]), calibration_z(candidate)
    inside = low <= ratio <= high
    figures["calibration"] = {
        "ratio": ratio,
        "z": cal_z,
        "bound": policy.calibration_bound,
        "max_z": policy.calibration_z,
    }
    if not inside and abs(cal_z) > policy.calibration_z:
        return Verdict(
            "rollback", f"calibration ratio {ratio:.4f} outside [{low:g}, {high:g}], z {cal_z:+.2f}", figures
        )
    if not _enough(stable, policy, "auc", "auc_var"):
        rows = 0 if stable is None else int(stable.get("rows") or 0)
        return Verdict("wait", f"stable has {rows} of {policy.min_rows} joined rows with figures", figures)
    assert stable is not None
    diff = float(candidate["auc"]) - float(stable["auc"])
    se = math.sqrt(max(0.0, float(candidate["auc_var"])) + max(0.0, float(stable["auc_var"])))
    z = NormalDist().inv_cdf(policy.confidence)
    lower, upper = diff - z * se, diff + z * se
    figures["test"] = {
        "auc_diff": diff,
        "se": se,
        "z": z,
        "lower": lower,
        "upper": upper,
        "auc_margin": policy.auc_margin,
        "confidence": policy.confidence,
        "calibration_ratio": ratio,
    }
    shown = f"AUC diff {diff:+.4f}, {policy.confidence:g} interval [{lower:+.4f}, {upper:+.4f}]"
    if upper < -policy.auc_margin:
        return Verdict("rollback", f"{shown}: worse than stable by more than {policy.auc_margin:g}", figures)
    if lower > -policy.auc_margin and not inside:
        return Verdict(
            "wait",
            f"{shown}; calibration ratio {ratio:.4f} outside [{low:g}, {high:g}] by chance so far",
            figures,
        )
    if lower > -policy.auc_margin:
        return Verdict("promote", f"{shown}, calibration ratio {ratio:.4f}: not worse than stable", figures)
    return Verdict("wait", f"{shown}: not yet decided", figures)
