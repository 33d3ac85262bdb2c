"""Training's errors: each one a problem the user can fix, with a one-line message that names the value and the fix.

`python -m training` prints `error: <message>` for a `TrainingError` (and for an `OSError` that names a file)
and exits 1 (2 for options that do not make a run). Any other exception is a bug and keeps its traceback.
Each class also derives from the built-in its callers caught before it existed (ValueError or RuntimeError).
"""

from __future__ import annotations

from ctr_features.errors import DataError, MalformedRowError, UserError

# A run cannot go on for a reason the user can fix. One base with the feature package's errors (the Criteo
# reader's DataError and MalformedRowError are defined there, ctr_features/errors.py), so one `except` takes both.
TrainingError = UserError


__all__ = [
    "ConfigError",
    "DataError",
    "DistributedSetupError",
    "MalformedRowError",
    "NonFiniteLossError",
    "TrainingError",
]


class ConfigError(TrainingError, ValueError):
    """Options or a `--config` file that do not make a run; the message names the option."""


class NonFiniteLossError(TrainingError, RuntimeError):
    """The loss or the weights went NaN/Inf; raised before any checkpoint of the poisoned state is written."""


class DistributedSetupError(TrainingError, RuntimeError):
    """Ranks could not meet within the DDP timeout; the message says what to check."""
