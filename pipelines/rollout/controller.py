"""The rollout controller's decisions: which version is the candidate, and when it moves on or is rolled back.

Every tick it looks at the model's base path (from the config file), the server (load states and fallbacks,
pipelines/rollout/server.py) and the live evaluator's snapshot (pipelines/rollout/policy.py), and makes at
most a few decisions, each committed through the journal (pipelines/rollout/journal.py) before the config
file changes:

- no stable version yet: the config's `stable` label is adopted ("adopt"), or else the newest complete
  version becomes stable directly ("promote");
- no candidate: the newest complete version above every version decided so far is checked against its
  manifest (a corrupt one is rolled back at once, never listed) and listed, unlabelled, so the server loads
  it ("load"); the versions it skips are decided too (never candidates later);
- a loaded candidate (AVAILABLE on the server) takes the policy's steps: `shadow` (label shadow, the shadow
  share), `canary` (label canary, the canary share), then `stable` ("promote": label stable, the shares 0);
- it is rolled back ("rollback": label and share removed, unlisted, never retried) when the server reports
  it failed to load, or not AVAILABLE after the load timeout, or any fallback answered in its place
  (`ctr_serving_fallbacks_total`), or its folder is gone, or the test says it is worse or miscalibrated.

Stable stays labelled and listed throughout; the previous stable stays listed too (`keep_previous`), so the
server has a last good version to fall back to.

For the tests, `CTR_ROLLOUT_KILL_AT=journal:N` (or `config:N`) makes the process SIGKILL itself right after
decision N's journal line (or its config write): a real kill at an exact point of a decision.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctr_store.errors import StoreError
from pipelines.rollout import config_file
from pipelines.rollout.config_file import ConfigFileError, Target
from pipelines.rollout.journal import KEEP_REJECTED, State, Store
from pipelines.rollout.metrics import RolloutMetrics
from pipelines.rollout.policy import Policy, figure, judge, read_snapshot
from pipelines.rollout.server import LoadState, ServerProbe
from pipelines.rollout.versions import Versions
from pipelines.service.loop import Stop, Ticks, run

log = logging.getLogger("pipelines.rollout")
KILL_AT = "CTR_ROLLOUT_KILL_AT"
MAX_DECISIONS_PER_TICK = 8


def _kill_point(point: str, seq: int) -> None:
    if os.environ.get(KILL_AT) == f"{point}:{seq}":
        os.kill(os.getpid(), signal.SIGKILL)


class Controller:
    """One model's rollout, driven by `tick()`."""

    def __init__(
        self,
        config_path: Path,
        model: str,
        eval_state: Path,
        store: Store,
        policy: Policy,
        probe: ServerProbe | None,
        metrics: RolloutMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config_path, self.model, self.eval_state = config_path, model, eval_state
        self.store, self.policy, self.probe, self.clock = store, policy, probe, clock
        self.metrics = metrics or RolloutMetrics()
        self.decisions = store.decisions()
        self.state = store.state_file.open(
            State(model), {"model": "--model"}, "rolled out", "a new --state-dir"
        )
        last = self.decisions[-1] if self.decisions else None
        # A decision journalled but not finished (killed before its state was saved): finished on the next tick.
        self.pending = last if last is not None and last["seq"] > self.state.seq else None
        if self.pending is not None:
            seq, action, version = (self.pending[k] for k in ("seq", "action", "version"))
            log.info(
                "%s: decision %d (%s version %s) is journalled, not finished: finishing it",
                model,
                seq,
                action,
                version,
            )
        self._said: dict[str, str] = {}
        self.metrics.start(model, self.decisions)
        shown = State.from_dict(self.pending["state"]) if self.pending else self.state
        self.metrics.show(model, shown.stable, shown.candidate, shown.target)

    # --- one tick ---------------------------------------------------------------------------------
    def tick(self) -> list[dict[str, Any]]:
        """Finish a pending decision, then decide until nothing more is due; returns the new decisions."""
        if not self._finish_pending():
            return []
        made = []
        for _ in range(MAX_DECISIONS_PER_TICK):
            try:
                record = self._decide()
            except ConfigFileError as exc:
                self._say("config", f"{exc}; no decision until the model config file is fixed", logging.ERROR)
                break
            except StoreError as exc:  # a base path in a bucket that cannot be read now
                self._say("store", f"{exc}; no decision until the store answers", logging.ERROR)
                break
            if record is None:
                break
            made.append(record)
            if self.pending is not None:
                break  # its config or state write failed: finished on the next tick
        return made

    def _finish_pending(self) -> bool:
        """Write the config and the state of the journalled decision `pending`; False when that failed."""
        if self.pending is None:
            return True
        record = self.pending
        try:
            config_file.apply(self.config_path, self.model, Target.from_dict(record["target"]))
            _kill_point("config", record["seq"])
            state = State.from_dict(record["state"])
            self.store.state_file.save(state)
        except (ConfigFileError, OSError, StoreError) as exc:
            self._say("config", f"cannot finish decision {record['seq']} yet: {exc}", logging.ERROR)
            return False
        self.state, self.pending = state, None
        self.metrics.show(self.model, state.stable, state.candidate, state.target)
        return True

    def _say(self, key: str, text: str, level: int = logging.INFO) -> None:
        """Log `text` once until what is said under `key` changes."""
        if self._said.get(key) != text:
            self._said[key] = text
            log.log(level, "%s: %s", self.model, text)

    # --- decisions ----------------------------------------------------------------------------------
    def _decide(self) -> dict[str, Any] | None:
        text = config_file.read_text(self.config_path)
        spec = config_file.model_spec(text, self.model, f"the model config {self.config_path}")
        on_disk = Versions(spec.base_path)
        # Only versions above the floor can be decided on: a bucket's manifests are read for those alone.
        complete = [v for v in on_disk if v > self.state.floor and on_disk.complete(v)]
        s = self.state
        if s.stable is None:
            label = spec.labels.get("stable")
            if s.seq == 0 and label is not None and label in on_disk:
                new = replace(s, stable=label, floor=max(s.floor, label))
                return self._commit(
                    "adopt", label, "the config's stable label", new, self._base(new, on_disk)
                )
            return self._first(complete, on_disk)
        if s.candidate is None:
            return self._pick(complete, on_disk)
        return self._advance(on_disk)

    def _base(self, s: State, on_disk: Versions, *extra: int) -> Target:
        """Stable (and the previous stable, kept) listed and labelled stable, with `extra` listed too."""
        assert s.stable is not None
        keep = (
            [s.previous]
            if self.policy.keep_previous and s.previous is not None and s.previous in on_disk
            else []
        )
        versions = tuple(sorted({s.stable, *keep, *extra}))
        return Target(versions, {"stable": s.stable})

    def _first(self, complete: list[int], on_disk: Versions) -> dict[str, Any] | None:
        s = self.state
        for v in reversed([v for v in complete if v > s.floor]):
            verdict, why = on_disk.check(v)
            if verdict == "not_ready":
                self._say("files", f"version {v} is not complete yet: {why}")
                return None
            if verdict == "ok":
                new = replace(s, stable=v, floor=v)
                return self._commit(
                    "promote",
                    v,
                    "the first version: no stable to compare with",
                    new,
                    self._base(new, on_disk),
                )
            self._say(
                "files", f"version {v} is corrupt ({why}); the next older one may be the first", logging.ERROR
            )
        return None

    def _pick(self, complete: list[int], on_disk: Versions) -> dict[str, Any] | None:
        s = self.state
        assert s.stable is not None
        newer = [v for v in complete if v > max(s.floor, s.stable)]
        if not newer:
            return None
        v = newer[-1]
        verdict, why = on_disk.check(v)
        if verdict == "not_ready":
            self._say("files", f"version {v} is not complete yet: {why}")
            return None
        skipped = [u for u in newer[:-1]]
        note = f"; skips {skipped}" if skipped else ""
        if verdict == "corrupt":
            new = replace(s, floor=v, rejected=[*s.rejected, v][-KEEP_REJECTED:])
            return self._commit(
                "rollback", v, f"corrupt files, never listed: {why}{note}", new, self._base(new, on_disk)
            )
        new = replace(s, candidate=v, step="load", step_since=self.clock(), floor=v)
        return self._commit(
            "load", v, f"new version: listed for the server to load{note}", new, self._base(new, on_disk, v)
        )

    def _advance(self, on_disk: Versions) -> dict[str, Any] | None:
        s = self.state
        v = s.candidate
        assert v is not None and s.step is not None and s.step_since is not None
        if v not in on_disk:
            return self._rollback(on_disk, f"version folder {v} is gone from the base path")
        status = self.probe.status(self.model) if self.probe else None
        load = (status or {}).get(v)
        if load is not None and load.failed:
            return self._rollback(on_disk, f"failed to load: {load.error_code} {load.error_message}".strip())
        fallbacks = self.probe.fallbacks(self.model) if self.probe else None
        if fallbacks and fallbacks.get(v, 0.0) > 0:
            return self._rollback(
                on_disk, f"the server answered {fallbacks[v]:g} of its requests from a fallback"
            )
        if s.step == "load":
            return self._loaded(on_disk, status, load)
        snapshot = read_snapshot(self.eval_state)
        candidate = figure(snapshot, self.model, v, s.step)
        stable = figure(snapshot, self.model, s.stable, "stable")  # type: ignore[arg-type]
        verdict = judge(candidate, stable, self.policy)
        figures = {**verdict.figures, "snapshot_interval": (snapshot or {}).get("interval")}
        if verdict.action == "rollback":
            return self._rollback(on_disk, f"{s.step}: {verdict.reason}", figures)
        if verdict.action == "promote":
            return self._next(on_disk, f"{s.step}: {verdict.reason}", figures)
        self._say("wait", f"version {v} in {s.step}: {verdict.reason}")
        return None

    def _loaded(
        self, on_disk: Versions, status: dict[int, LoadState] | None, load: LoadState | None
    ) -> dict[str, Any] | None:
        s = self.state
        assert s.step_since is not None
        if self.probe is None or (load is not None and load.state == "AVAILABLE"):
            return self._next(
                on_disk, "AVAILABLE on the server" if self.probe else "listed (no server to ask)"
            )
        if status is None:
            self._say("server", f"the server at {self.probe.url} does not answer; waiting", logging.WARNING)
            return None
        waited = self.clock() - s.step_since
        if waited > self.policy.load_timeout_s:
            state = load.state if load else "not reported"
            return self._rollback(on_disk, f"not AVAILABLE {waited:.0f} s after it was listed ({state})")
        self._say("wait", f"version {s.candidate} loading ({load.state if load else 'not reported yet'})")
        return None

    def _next(self, on_disk: Versions, reason: str, figures: dict[str, Any] | None = None) -> dict[str, Any]:
        s = self.state
        v = s.candidate
        assert v is not None and s.step is not None
        step = self.policy.next_step(s.step)
        if step == "stable":
            new = replace(s, stable=v, previous=s.stable, candidate=None, step=None, step_since=None)
            return self._commit("promote", v, reason, new, self._base(new, on_disk), figures)
        new = replace(s, step=step, step_since=self.clock())
        base = self._base(new, on_disk, v)
        share = {f"{step}_percent": getattr(self.policy, f"{step}_percent")}
        target = replace(base, labels={**base.labels, step: v}, **share)
        return self._commit(step, v, reason, new, target, figures)

    def _rollback(
        self, on_disk: Versions, reason: str, figures: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        s = self.state
        assert s.candidate is not None
        new = replace(
            s,
            candidate=None,
            step=None,
            step_since=None,
            rejected=[*s.rejected, s.candidate][-KEEP_REJECTED:],
        )
        return self._commit("rollback", s.candidate, reason, new, self._base(new, on_disk), figures)

    def _commit(
        self,
        action: str,
        version: int,
        reason: str,
        new: State,
        target: Target,
        figures: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Journal the decision, then write the config, then the state (the order a restart relies on)."""
        text = config_file.read_text(self.config_path)
        rendered = config_file.render(text, self.model, target)
        config_file.check(
            rendered, self.model, target, f"the model config {self.config_path} as it would be written"
        )
        new = replace(new, seq=self.state.seq + 1, target=target.to_dict())
        record = {
            "seq": new.seq,
            "time": self.clock(),
            "model": self.model,
            "action": action,
            "version": version,
            "from": self.state.step or ("stable" if self.state.stable == version else None),
            "to": new.step or ("stable" if new.stable == version else "rejected"),
            "reason": reason,
            "figures": figures or {},
            "target": target.to_dict(),
            "state": new.to_dict(),
        }
        self.store.append(record)  # the decision is made: a restart finishes it, never makes it again
        _kill_point("journal", new.seq)
        self.decisions.append(record)
        self.metrics.decisions.labels(self.model, action).inc()
        log.info("%s: decision %d: %s version %d: %s", self.model, new.seq, action, version, reason)
        self.pending = record
        self._finish_pending()
        return record

    def run(self, interval_s: float, stop: Stop | None = None) -> None:
        """Tick every `interval_s` seconds until `stop` is asked (after the tick under way); a tick that fails is
        logged and tried again on the next."""
        run(Ticks(self.tick, interval_s, log, f"{self.model}: a rollout tick"), stop)
