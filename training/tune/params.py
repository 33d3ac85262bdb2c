"""What `make tune` searches, and the file it hands to `make train`: `best.json` (read by `--config`).

Kept free of Optuna imports at module level: `python -m training --config best.json` needs only `load_tuned_params`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctr_model.net import ACTIVATIONS
from training.errors import ConfigError

# The hyperparameters a trial draws, with the `python -m training` option each one sets.
TUNED_KEYS = ("lr", "batch_size", "dropout1", "dropout2", "weight_decay", "activation")
BATCH_SIZES = (512, 1024, 2048, 4096)
LR_RANGE = (1e-4, 1e-2)  # log-uniform
DROPOUT_RANGE = (0.0, 0.5)
WEIGHT_DECAY_RANGE = (1e-8, 1e-3)  # log-uniform; Adam's L2 penalty


def suggest(trial: Any) -> dict[str, Any]:
    """Draw one point of the search space from an `optuna.Trial` (TPE picks it after the startup trials)."""
    return {
        "lr": trial.suggest_float("lr", *LR_RANGE, log=True),
        "batch_size": trial.suggest_categorical("batch_size", list(BATCH_SIZES)),
        "dropout1": trial.suggest_float("dropout1", *DROPOUT_RANGE),
        "dropout2": trial.suggest_float("dropout2", *DROPOUT_RANGE),
        "weight_decay": trial.suggest_float("weight_decay", *WEIGHT_DECAY_RANGE, log=True),
        "activation": trial.suggest_categorical("activation", list(ACTIVATIONS)),
    }


def load_tuned_params(path: Path) -> dict[str, Any]:
    """The `params` of a `best.json`, as `python -m training` option defaults (dest name -> value).

    Raises:
        ConfigError: no file at `path`, the file is not a tune result, or it names a parameter
            `python -m training` does not know.
    """
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file; `make tune` writes DIR/best.json")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"--config {path} is not JSON: {e}") from None
    params = doc.get("params") if isinstance(doc, dict) else None
    if not isinstance(params, dict):
        raise ConfigError(
            f'--config {path} has no "params" object; expected the best.json `make tune` writes'
        )
    unknown = sorted(set(params) - set(TUNED_KEYS))
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown parameters {unknown}; expected some of {list(TUNED_KEYS)}"
        )
    return dict(params)
