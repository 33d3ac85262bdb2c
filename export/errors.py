"""Typed export errors: each one names the offending value and what was expected."""

from __future__ import annotations


class ExportError(Exception):
    """Base class: the export cannot produce a valid version; nothing is published."""


class InputError(ExportError):
    """A checkpoint, feature spec or option that cannot be used as given."""


class UnsupportedOpError(ExportError):
    """An ONNX op that the target op set or the TF translator does not cover."""


class ParityError(ExportError):
    """PyTorch, ONNX Runtime and the SavedModel disagree beyond the tolerance."""


class PublishError(ExportError):
    """The model repository cannot take the new version (unwritable, version taken)."""
