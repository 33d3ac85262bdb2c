"""One `make tune` trial in its own process: train with the drawn parameters, report val AUC per epoch.

    python -m training.tune.trial --storage sqlite:///DIR/study.db --study ctr --trial-id 3 \
        --params '{"lr": 0.002, ...}' --data FILE --out DIR/trials/0003 --result DIR/trials/0003/result.json

The parent (`training.tune`) asked the study for the trial and drew its parameters; this process only trains,
reports `val_auc` after each validation to the shared SQLite study, and stops when the pruner says so. It
writes `--result` ({"state": "complete"|"pruned", ...}); a crash leaves none, and the parent records a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import optuna

from training.config import TrainConfig


def build_pruner() -> optuna.pruners.BasePruner:
    """Median pruning: stop a trial whose val AUC after an epoch is below the median of earlier trials there."""
    # Three complete trials first, so the median means something.
    return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0)


class ValAucPruning(L.Callback):
    """After each validation: report val AUC to the trial (step = epoch) and stop the fit when pruned.

    The last epoch is never pruned: its value is the trial's result anyway.
    """

    def __init__(self, trial: optuna.Trial, max_epochs: int) -> None:
        self.trial = trial
        self.max_epochs = max_epochs
        self.history: list[float] = []
        self.pruned_at: int | None = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or "val_auc" not in trainer.callback_metrics:
            return
        epoch = trainer.current_epoch
        auc = float(trainer.callback_metrics["val_auc"])
        self.history.append(auc)
        self.trial.report(auc, step=epoch)
        if epoch < self.max_epochs - 1 and self.trial.should_prune():
            self.pruned_at = epoch
            trainer.should_stop = True


def run_trial(args: argparse.Namespace) -> dict[str, Any]:
    """Train one trial; returns what goes into `--result`."""
    from training.train import run_training

    study = optuna.load_study(study_name=args.study, storage=args.storage, pruner=build_pruner())
    trial = optuna.Trial(study, args.trial_id)
    params = json.loads(args.params)
    cfg = TrainConfig(
        data=args.data,
        out=args.out,
        max_rows=args.max_rows,
        max_epochs=args.epochs,
        patience=args.epochs,  # early stopping would end trials the pruner should judge
        seed=args.seed,
        progress_bar=False,
        **params,
    )
    pruning = ValAucPruning(trial, args.epochs)
    metrics = run_training(cfg, callbacks=[pruning])
    assert metrics is not None  # a single process is global rank 0
    if pruning.pruned_at is not None:
        return {"state": "pruned", "epoch": pruning.pruned_at, "val_auc_per_epoch": pruning.history}
    return {"state": "complete", "val_auc": metrics["val_auc"], "val_auc_per_epoch": pruning.history}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.tune.trial", description=__doc__)
    p.add_argument("--storage", required=True, help="the study's storage URL (sqlite:///DIR/study.db)")
    p.add_argument("--study", required=True)
    p.add_argument("--trial-id", type=int, required=True, help="storage id of the trial the parent asked for")
    p.add_argument("--params", required=True, help="JSON of the drawn parameters (TrainConfig fields)")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", type=Path, required=True, help="the trial's run directory")
    p.add_argument("--result", type=Path, required=True)
    args = p.parse_args(argv)
    result = run_trial(args)
    args.result.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
