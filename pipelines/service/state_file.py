"""A service's state as one typed JSON file, replaced durably (pipelines/durable.py).

The state is a dataclass; the file is its fields as JSON, replaced whole (temporary file, fsync, rename, fsync of
the folder), so a kill or a full disk at any moment leaves the previous state or the new one, never a mix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pipelines.durable import replace_file

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


class StateFile(Generic[T]):
    """The state of type `kind` in the JSON file `path`; `what` names it in errors (e.g. "a trainer state")."""

    def __init__(self, path: Path, kind: type[T], what: str) -> None:
        self.path, self.kind, self.what = path, kind, what

    def load(self) -> T | None:
        """The saved state; None when there is none yet. ValueError when the file does not hold one."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            return self.kind(**json.loads(text))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{self.path} is not {self.what} ({e}); move it away to start afresh") from e

    def save(self, state: T) -> None:
        """Replace the saved state; on an OSError (full disk) the previous state stays intact."""
        replace_file(self.path, json.dumps(asdict(state), indent=1, sort_keys=True) + "\n")

    def open(self, fresh: T, fixed: Mapping[str, str], made: str, fix: str) -> T:
        """The saved state, or `fresh`, saved now, when there is none.

        Args:
            fixed: field -> its flag, for the settings a state cannot change: a saved state whose fields differ
                from `fresh`'s was made with other flags, and is refused (ValueError).
            made: what was done with them ("trained", "evaluated"), and `fix` the folder to use instead.
        """
        saved = self.load()
        if saved is None:
            self.save(fresh)
            return fresh
        if any(getattr(saved, f) != getattr(fresh, f) for f in fixed):
            was = " ".join(f"{flag} {_show(getattr(saved, f))}" for f, flag in fixed.items())
            given = " and ".join(_show(getattr(fresh, f)) for f in fixed)
            those = "those" if len(fixed) > 1 else "that"
            raise ValueError(f"{self.path.parent} was {made} with {was}, not {given}; use {those} or {fix}")
        return saved


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)
