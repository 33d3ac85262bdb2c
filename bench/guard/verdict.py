"""The guard's rule: HEAD against the baseline, figure by figure, from rounds measured back to back.

For one figure, each round measured HEAD and the baseline one right after the other (bench/guard/rounds.py).
- A side's **median** is the median of its rounds; its **spread** is the median of its rounds' absolute
  relative deviations from that median, median(|v_i / median - 1|): the typical round's distance, which one
  stray round (a stall, a neighbour's burst) does not move, as it would the largest deviation.
- A round's **ratio** is HEAD's value over the baseline's in that round, turned so that above 1 is better:
  HEAD / baseline for a throughput, baseline / HEAD for a latency. The two were measured back to back, so the
  machine's load of that moment cancels out of the ratio. The figure's **ratio** is the median of the rounds'
  ratios; the **ratio spread** is their spread, as above.
- HEAD **fails** a figure when its ratio is below 1 - (TOLERANCE + ratio spread): worse than the baseline by
  more than 10%, beyond the noise its own rounds show. The guard fails when any figure fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

TOLERANCE = 0.10  # how much worse than the baseline HEAD may be, beyond the rounds' spread
NOISY = 0.08  # a ratio spread above this may leave a 20% slowdown undetected: the table says so


@dataclass(frozen=True)
class Figure:
    """One guarded figure: its name in the table, its unit, and which way is better."""

    name: str
    unit: str
    higher_is_better: bool


@dataclass(frozen=True)
class Side:
    """One side's rounds of one figure, summarised."""

    median: float
    spread: float


@dataclass(frozen=True)
class Verdict:
    """One figure's outcome: both sides, the paired ratio (above 1: HEAD better) and whether HEAD fails."""

    figure: Figure
    head: Side
    baseline: Side
    ratio: float
    ratio_spread: float
    rounds: int

    @property
    def threshold(self) -> float:
        """The lowest ratio that passes."""
        return 1 - (TOLERANCE + self.ratio_spread)

    @property
    def failed(self) -> bool:
        return self.ratio < self.threshold


def spread(values: list[float]) -> float:
    """The median of the values' absolute relative deviations from their median: median(|v / median - 1|)."""
    middle = median(values)
    return median(abs(v / middle - 1) for v in values) if middle else 0.0


def judge(figure: Figure, head: list[float], baseline: list[float]) -> Verdict:
    """The verdict on one figure from its rounds, `head[i]` and `baseline[i]` measured in the same round.

    Raises:
        ValueError: the two sides have different round counts, none, or a value that is not positive.
    """
    if len(head) != len(baseline) or not head:
        raise ValueError(f"{figure.name}: {len(head)} HEAD rounds against {len(baseline)} baseline rounds")
    if min(head + baseline) <= 0:
        raise ValueError(f"{figure.name}: every round must be positive, got {head} and {baseline}")
    pairs = zip(head, baseline, strict=True)
    ratios = [h / b if figure.higher_is_better else b / h for h, b in pairs]
    return Verdict(
        figure,
        Side(median(head), spread(head)),
        Side(median(baseline), spread(baseline)),
        median(ratios),
        spread(ratios),
        len(head),
    )


def table(verdicts: list[Verdict]) -> str:
    """The markdown table: each figure's sides (median ± spread), the ratio ± its spread, the threshold, the verdict."""
    lines = [
        "| figure | HEAD median (± spread) | baseline median (± spread) | ratio (± spread) | fails below | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for v in verdicts:
        noisy = f", noisy (ratio spread over {NOISY:.0%})" if v.ratio_spread > NOISY else ""
        lines.append(
            f"| {v.figure.name} | {_value(v.head, v.figure)} | {_value(v.baseline, v.figure)} "
            f"| {v.ratio:.3f} (± {v.ratio_spread:.1%}) | {v.threshold:.3f} "
            f"| {'FAIL' if v.failed else 'ok'}{noisy} |"
        )
    return "\n".join(lines)


def _value(side: Side, figure: Figure) -> str:
    digits = 2 if side.median < 100 else 0
    return f"{side.median:,.{digits}f} {figure.unit} (± {side.spread:.1%})"
