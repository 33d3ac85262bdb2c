"""The online trainer's durable state: the next interval to train, the one being published, what each produced.

The state is one JSON file replaced atomically (pipelines/service/state_file.py), so a kill or a full disk at
any moment leaves the previous state or the new one, never a mix. An interval is finished only when the state
says so; a restarted trainer starts at `next`.

Publishing and finishing cannot be one atomic step, so the trainer writes `pending` (interval, version number)
before it exports with that explicit version. A restart that finds `pending` looks in the model repository:
when the version is there, the interval was published and is finished now, not trained again; when it is not,
the interval is trained again from the start (nothing of it was published).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.service.state_file import StateFile

STATE_FILE = "state.json"
KEEP_OUTCOMES = 1000  # the newest outcomes kept in the state; the log and the metrics keep the rest


@dataclass
class State:
    """Where the trainer is; every field survives a restart."""

    interval_s: float
    window_s: float
    next: int
    pending: dict[str, int] | None = None
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    # version -> Unix time of the newest request it was trained on (for the freshness metric)
    newest_row_time: dict[str, float] = field(default_factory=dict)

    def finish(self, outcome: dict[str, Any]) -> None:
        """Record one finished interval and move on to the next."""
        self.outcomes = [*self.outcomes, outcome][-KEEP_OUTCOMES:]
        self.next, self.pending = outcome["interval"] + 1, None


def state_file(folder: Path) -> StateFile[State]:
    """The trainer's state file in its --work folder."""
    return StateFile(folder / STATE_FILE, State, "a trainer state")


def load(folder: Path) -> State | None:
    """The saved state, or None when the folder holds none yet."""
    return state_file(folder).load()


def save(folder: Path, state: State) -> None:
    """Replace the saved state atomically; on an OSError (full disk) the previous state stays intact."""
    state_file(folder).save(state)
