"""The PNGs of `make tune`: the optimisation history, and the parameter importances once there are enough trials."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless machines have no display
import matplotlib.pyplot as plt
import optuna

HISTORY_PNG = "optimization_history.png"
IMPORTANCE_PNG = "param_importances.png"
# PED-ANOVA compares the best trials with the rest; with fewer complete trials the ranking is noise.
MIN_TRIALS_FOR_IMPORTANCE = 5


def _save(ax: Any, path: Path) -> None:
    fig: Any = ax.figure  # plot_* return the Axes; the Figure holds the size and the PNG
    fig.set_size_inches(8, 4.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(study: optuna.Study, out_dir: Path) -> list[str]:
    """Write the history PNG (any complete trial) and the importance PNG (>= MIN_TRIALS_FOR_IMPORTANCE).

    Returns:
        The file names written, with a reason printed for each one skipped.
    """
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    written: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if not complete:
            print(f"[tune] no {HISTORY_PNG}: no trial completed")
            return written
        _save(
            optuna.visualization.matplotlib.plot_optimization_history(study, target_name="val AUC"),
            out_dir / HISTORY_PNG,
        )
        written.append(HISTORY_PNG)
        if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
            print(
                f"[tune] no {IMPORTANCE_PNG}: {len(complete)} complete trials, "
                f"importances need at least {MIN_TRIALS_FOR_IMPORTANCE}"
            )
            return written
        # PED-ANOVA needs no scikit-learn (the default fANOVA evaluator does).
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        ax = optuna.visualization.matplotlib.plot_param_importances(
            study, evaluator=evaluator, target_name="val AUC"
        )
        _save(ax, out_dir / IMPORTANCE_PNG)
        written.append(IMPORTANCE_PNG)
    return written
