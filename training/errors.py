"""Training's errors: each one a problem the user can fix, with a one-line message that names the value and the fix.

`python -m training` prints `error: <message>` for a `TrainingError` (and for an `OSError` that names a file)
and exits 1 (2 for options that do not make a run). Any other exception is a bug and keeps its traceback.
Each class also derives from the built-in its callers caught before it existed (ValueError or RuntimeError).
"""

from __future__ import annotations


class TrainingError(Exception):
    """A run cannot go on for a reason the user can fix."""


class ConfigError(TrainingError, ValueError):
    """Options or a `--config` file that do not make a run; the message names the option."""


class DataError(TrainingError, ValueError):
    """The input data cannot be used as given; the message names the path and the fix."""


class MalformedRowError(DataError):
    """A row that is not a Criteo record; the message names the file, line and field."""


class CheckpointError(TrainingError, ValueError):
    """A checkpoint (or warm-start source) that is missing, unreadable or does not hold a CTRNet."""


class NonFiniteLossError(TrainingError, RuntimeError):
    """The loss or the weights went NaN/Inf; raised before any checkpoint of the poisoned state is written."""


class DistributedSetupError(TrainingError, RuntimeError):
    """Ranks could not meet within the DDP timeout; the message says what to check."""
