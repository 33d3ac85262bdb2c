"""Shared constants of the training tests (imported by conftest and tests alike)."""

# A run that takes seconds on the 4000-row fixture: small batches, two epochs, no early stop, no progress bar.
TINY_RUN = ("--batch-size", "256", "--max-epochs", "2", "--patience", "5", "--no-progress-bar")
