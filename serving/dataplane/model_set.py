"""The served models by name: one model (`--model_name`) or those of `--model_config_file`, changing at run time.

Each model is its own ModelManager (versions, policy) and Router (labels, split) with its own Predictor; they share the metrics,
the limits and the inference thread. Adding a model starts its version polling; removing one takes it out of
the lookup at once (new requests get 404) and retires its versions, each unloaded after its last in-flight
request, so requests to the other models never notice (serving/repository/model_config.py has the file's rules).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from serving.dataplane.predictor import Predictor
from serving.errors import NotFound
from serving.repository.model_config import ModelSpec

log = logging.getLogger(__name__)


class ServedModels:
    """Name -> Predictor; `lookup` is what the REST and gRPC handlers call once per request."""

    def __init__(self, predictors: dict[str, Predictor], single: bool) -> None:
        """`single`: the `--model_name` server, where a wrong name gets the manager's own NotFound message."""
        self.predictors = predictors
        self._single = single

    @classmethod
    def one(cls, predictor: Predictor) -> ServedModels:
        return cls({predictor.manager.name: predictor}, single=True)

    def current(self) -> dict[str, Predictor]:
        return self.predictors

    def lookup(self, name: str) -> Predictor:
        """The predictor of model `name`; NotFound naming the served models when there is none."""
        predictor = self.predictors.get(name)
        if predictor is not None:
            return predictor
        if self._single:  # its manager answers with TF Serving's exact message for the unknown name
            return next(iter(self.predictors.values()))
        raise NotFound(
            f"Servable not found for request: Latest({name}); served models: {sorted(self.predictors)}"
        )

    @property
    def inflight(self) -> int:
        return sum(p.inflight for p in self.predictors.values())

    async def drain(self, grace_s: float) -> bool:
        """Drain every model at once; True when all in-flight requests finished within `grace_s`."""
        results = await asyncio.gather(*(p.drain(grace_s) for p in self.predictors.values()))
        return all(results)

    def drift_text(self) -> str:
        return "".join(p.drift_text() for p in self.predictors.values())


class ModelSet(ServedModels):
    """The models of `--model_config_file`; `apply` makes the served set equal to a new config."""

    def __init__(self, build: Callable[[ModelSpec], Predictor], poll_wait_s: float) -> None:
        super().__init__({}, single=False)
        self._build, self._poll_wait_s = build, poll_wait_s
        self.specs: dict[str, ModelSpec] = {}
        self._polls: dict[str, asyncio.Task[None]] = {}

    async def apply(self, specs: list[ModelSpec]) -> None:
        """Remove models no longer listed, add new ones, update policy, labels and split in place; then scan."""
        wanted = {s.name: s for s in specs}
        for name in [
            n for n in self.specs if n not in wanted or wanted[n].base_path != self.specs[n].base_path
        ]:
            self._remove(name)
        added = []
        for name, spec in wanted.items():
            if name in self.predictors:
                manager, router = self.predictors[name].manager, self.predictors[name].router
                traffic = spec.traffic or router.default_traffic  # no ctr-traffic line: the flags' shares
                if router.traffic != traffic:
                    log.info("model %s: traffic %s", name, traffic)
                if (manager.policy, router.labels) != (spec.policy, spec.labels):
                    log.info("model %s: version policy %s, labels %s", name, spec.policy, spec.labels)
                    added.append(name)  # rescan now: the policy may want other versions
                manager.change_policy(spec.policy)
                router.configure(spec.labels, traffic)
            else:
                log.info("model %s added from %s", name, spec.base_path)
                self.predictors[name] = self._build(spec)
                added.append(name)
            self.specs[name] = spec
        await asyncio.gather(*(self._first_scan(name) for name in added))

    async def _first_scan(self, name: str) -> None:
        manager = self.predictors[name].manager
        try:
            await manager.poll_once()
        except Exception:  # e.g. an unreadable base path: the model waits for the next poll, the others serve
            log.exception("first scan of model %s at %s failed", name, manager.base_path)
        if name not in self._polls and self._poll_wait_s > 0 and name in self.predictors:
            self._polls[name] = asyncio.create_task(manager.poll_forever(self._poll_wait_s))

    def _remove(self, name: str) -> None:
        predictor = self.predictors.pop(name)
        del self.specs[name]
        poll = self._polls.pop(name, None)
        if poll is not None:
            poll.cancel()
        log.info("model %s removed: %d requests in flight finish first", name, predictor.inflight)
        predictor.shadow.stop()  # its queued shadow work goes with it
        predictor.manager.retire_all("model removed from --model_config_file")

    def stop(self) -> None:
        """Cancel every model's version polling (at shutdown)."""
        for poll in self._polls.values():
            poll.cancel()
