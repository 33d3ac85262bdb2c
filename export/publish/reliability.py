"""RUN/reliability.png: the reliability diagram of the calibrator's reporting half, before and after it.

Rows are sorted by prediction into equal-count bins (the ECE's bins); each bin is a point at (mean predicted,
observed click rate). A calibrated model's points lie on the diagonal. matplotlib is imported only here, to draw.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ctr_model.metrics import expected_calibration_error

log = logging.getLogger(__name__)
BINS = 10


def bin_points(labels: np.ndarray, probs: np.ndarray, bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """(mean predicted, observed rate) per equal-count bin of rows sorted by prediction."""
    order = np.argsort(probs, kind="mergesort")
    parts = [p for p in np.array_split(order, bins) if len(p)]
    return np.array([probs[p].mean() for p in parts]), np.array([labels[p].mean() for p in parts])


def write_reliability(
    path: Path, labels: np.ndarray, before: np.ndarray, after: np.ndarray, after_label: str
) -> bool:
    """Draw the diagram into `path` (PNG); False (with a warning) when matplotlib is not installed.

    Args:
        labels, before, after: the reporting half's clicks, and its scores before and after the calibrator.
        after_label: what `after` is, e.g. "after (isotonic, refit on all 10000 rows)".
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: export runs in jobs and containers
        import matplotlib.pyplot as plt
    except ImportError as e:
        log.warning("no %s: matplotlib is not installed (pip install '.[export]'): %s", path, e)
        return False
    fig, ax = plt.subplots(figsize=(5, 5), dpi=110)
    top = float(max(before.max(), after.max(), labels.mean() * 2, 1e-3))
    ax.plot([0, top], [0, top], color="0.6", lw=1, ls="--", label="calibrated")
    for probs, name, style in ((before, "before", "o-"), (after, after_label, "s-")):
        x, y = bin_points(labels, probs)
        ece = expected_calibration_error(labels, probs)
        ratio = probs.mean() / labels.mean() if labels.mean() > 0 else float("nan")
        ax.plot(x, y, style, ms=4, label=f"{name}: ECE {ece:.4f}, ratio {ratio:.3f}")
    ax.set_xlabel("mean predicted CTR (bin)")
    ax.set_ylabel("observed CTR (bin)")
    ax.set_title(f"reliability on the reporting half ({len(labels)} rows), {BINS} bins")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
