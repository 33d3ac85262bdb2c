"""The feature package's errors: each one a problem the user can fix, with a one-line message that names the
value and the fix.

`UserError` is the base of every error the stages print as one `error:` line: training's `TrainingError` is
this class (training/errors.py), so the Criteo reader's data errors stop `python -m training` as its own do.
Each class also derives from the built-in its callers caught before it existed (ValueError).
"""

from __future__ import annotations


class UserError(Exception):
    """A run cannot go on for a reason the user can fix."""


class DataError(UserError, ValueError):
    """The input data cannot be used as given; the message names the path and the fix."""


class MalformedRowError(DataError):
    """A row that is not a Criteo record; the message names the file, line and field."""


class FeatureGraphError(UserError, ValueError):
    """A FeatureSpec or model graph that the raw ONNX graph cannot be built from; the message says why."""


class FeatureParityError(UserError, ValueError):
    """A compiled form of the FeatureSpec that does not give the reference transform's features."""
