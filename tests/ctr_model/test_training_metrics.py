"""roc_auc and log_loss against hand-computed cases and an independent pairwise definition of AUC."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ctr_model.metrics import log_loss, roc_auc


def pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """AUC by its definition: P(score of a positive > score of a negative), ties counting one half. O(P·N)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


@pytest.mark.parametrize(
    ("labels", "scores", "auc"),
    [
        ([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8], 0.75),  # the classic example: 3 of 4 pairs ordered
        ([0, 1], [0.2, 0.9], 1.0),
        ([0, 1], [0.9, 0.2], 0.0),
        ([0, 1], [0.5, 0.5], 0.5),  # a tie is half a win
        ([1, 0, 1, 0, 1], [3, 1, 2, 2, 2], 5 / 6),  # pairs: (3>1,3>2), (2>1, 2=2), (2>1, 2=2) -> 5/6
        ([1, 1, 0], [-7.0, 4.0, -7.0], 0.75),  # logits work too; a tie across the classes
    ],
)
def test_roc_auc_hand_computed(labels: list[int], scores: list[float], auc: float) -> None:
    assert roc_auc(np.array(labels), np.array(scores)) == pytest.approx(auc, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_matches_the_pairwise_definition_with_many_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 500)
    scores = np.round(rng.random(500) + 0.3 * labels, 1)  # rounding makes many ties
    assert roc_auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)


def test_roc_auc_rejects_one_class_and_length_mismatch() -> None:
    with pytest.raises(ValueError, match="AUC needs both classes, got 3 positives and 0 negatives"):
        roc_auc(np.ones(3), np.arange(3.0))
    with pytest.raises(ValueError, match="labels and scores differ in length: 2 vs 3"):
        roc_auc(np.array([0, 1]), np.arange(3.0))


def test_log_loss_hand_computed() -> None:
    expected = -(math.log(0.8) + math.log(0.6)) / 2
    assert log_loss(np.array([1, 0]), np.array([0.8, 0.4])) == pytest.approx(expected, abs=1e-12)
    assert log_loss(np.array([1]), np.array([0.0])) == pytest.approx(-math.log(1e-7), abs=1e-9)  # clipped
