"""The model's one error: a checkpoint (or warm-start source) that cannot be read back into a CTRNet.

Here, not in training/, so export loads a checkpoint without importing training. It is a
`ctr_features.errors.UserError` (training's `TrainingError`), so `python -m training` prints it as one
`error:` line like its own errors. No torch at import: the command lines catch it before they load torch.
"""

from __future__ import annotations

from ctr_features.errors import UserError


class CheckpointError(UserError, ValueError):
    """A checkpoint (or warm-start source) that is missing, unreadable or does not hold a CTRNet."""
