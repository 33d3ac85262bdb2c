"""The controller's durable record: every decision in STATE/decisions.jsonl, and where it stands in STATE/state.json.

A decision is made in three writes, in this order:

1. one line appended to `decisions.jsonl` (fsync): its sequence number, action, version, reason, figures, the
   config target it sets and the whole state after it;
2. the model config file, set to that target (pipelines/rollout/config_file.py, atomic);
3. `state.json`, the state after it (atomic: pipelines/service/state_file.py).

A controller killed between 1 and 3 finds a journal line newer than the state when it starts: it completes
that decision (the config write is idempotent) and takes its state, never deciding or counting it again. A
line cut short by a kill during 1 was never a decision: it is cut off the journal.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.durable import append_line, cut
from pipelines.service.state_file import StateFile

JOURNAL = "decisions.jsonl"
STATE = "state.json"
KEEP_REJECTED = 100  # the newest rejected versions kept in the state (the journal keeps every one)


@dataclass
class State:
    """Where the rollout of one model stands; every field survives a restart."""

    model: str
    seq: int = 0  # the last decision applied
    stable: int | None = None
    previous: int | None = None  # the stable before it, kept loaded as the server's fallback
    candidate: int | None = None
    step: str | None = None  # the candidate's step: "load", "shadow" or "canary"
    step_since: float | None = None  # Unix time the candidate entered its step
    floor: int = 0  # versions <= floor are decided: never a candidate again
    rejected: list[int] = field(default_factory=list)
    target: dict[str, Any] | None = None  # the config target of decision `seq`

    @staticmethod
    def from_dict(d: dict[str, Any]) -> State:
        return State(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Store:
    """The journal and the state of one controller (folder `STATE`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.journal = folder / JOURNAL
        self.state_file = StateFile(folder / STATE, State, "a rollout state")

    def decisions(self) -> list[dict[str, Any]]:
        """Every committed decision, oldest first; a torn last line (a kill mid-append) is cut off the file."""
        try:
            raw = self.journal.read_bytes()
        except FileNotFoundError:
            return []
        complete = raw[: raw.rfind(b"\n") + 1]
        cut(self.journal, len(complete))
        found = []
        for n, line in enumerate(complete.splitlines(), 1):
            try:
                record = json.loads(line)
                int(record["seq"])
                State.from_dict(record["state"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{self.journal} line {n} is not a decision ({exc}); move the folder away to start afresh"
                ) from exc
            found.append(record)
        return found

    def append(self, record: dict[str, Any]) -> None:
        """Append one decision and fsync it: once this returns, the decision is made."""
        append_line(self.journal, record)
