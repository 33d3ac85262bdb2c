"""Shadow scoring: a sampled share of unlabelled predicts scored again by the `shadow` label's version.

The model's `shadow_percent` (the `# ctr-traffic:` line of `--model_config_file`, or `--shadow_percent`;
ctr_contract/traffic.py) picks the requests: `mix32(zlib.crc32(b"shadow:" + request_id)) < percent / 100 * 2**32`
(a request without a client's id: a random choice); the router makes that choice (`Route.shadow`,
serving/routing/router.py). Only unlabelled requests are shadowed, never an explicit
`/versions/N` or `/labels/L`. After the client's answer is made, the request's decoded batch is copied into a
small bounded queue (`QUEUE_JOBS`) and the predict returns; one background task per model, woken by a job,
waits `GATHER_S` for more, takes the jobs queued (up to `BATCH_ROWS` rows) and scores them in one model call of
the shadow version (a few rows on the loop, as a runner does; more through its runner), then yields to the
requests before the next call. Nothing on the client's path waits for it, and nothing it does
reaches the client's answer.

Shadow work is dropped first, and counted in `ctr_serving_shadow_dropped_total{model_name,reason}`:

- `queue_full`: the queue holds `QUEUE_JOBS` jobs already (the worker is behind);
- `busy`: more than `BUSY_INFLIGHT` predicts of the model are in flight when the job would start;
- `unavailable`: no `shadow` label, or its version is not loaded (a version whose files are corrupt is never
  loaded, serving/repository/manager.py);
- `error`: the shadow version refused the request or failed on it (logged once a minute);
- `non_finite`: it scored NaN or infinity (not logged as a score).

A scored job counts in `ctr_serving_shadow_scored_total{model_name,version}`. When the request log
(serving/observability/request_log.py) wrote the primary line, the shadow scores go to the log as a shadow line:
the same request id and time, `"shadow": true`, `model.label` "shadow", `model.version` the shadow version,
`outputs` its scores and `inputs` null; so the click join (pipelines/clicks/join.py) labels both alike.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from ctr_contract.ratelog import RateLimitedLog
from serving.errors import InvalidArgument, Overloaded
from serving.observability.metrics import ServingMetrics
from serving.observability.request_log import RequestLog
from serving.repository.manager import ModelManager
from serving.requests import DecodedRequest
from serving.routing.router import SHADOW_LABEL, Router
from serving.runtime.batcher import INLINE_MAX_ROWS
from serving.runtime.servable import LoadedVersion, signature_calls
from serving.signatures import RAW_SIGNATURE

log = logging.getLogger(__name__)
limited = RateLimitedLog(log)
QUEUE_JOBS = 32  # shadow jobs waiting for the worker; beyond this new ones are dropped, never waited for
BUSY_INFLIGHT = 16  # more of the model's predicts in flight than this: the shadow job is dropped
BATCH_ROWS = 256  # queued jobs are scored together in one call of up to this many rows
GATHER_S = 0.002  # woken by a job, the worker waits this long for more before it scores


@dataclass(slots=True)
class _Job:
    request: DecodedRequest
    request_id: str | None
    logged_at: float | None  # the primary log line's time; None: the primary line was not logged
    request_log: RequestLog | None  # where the primary line went


class ShadowScorer:
    """The shadow queue and worker of one model (one Predictor)."""

    def __init__(
        self,
        manager: ModelManager,
        router: Router,
        metrics: ServingMetrics,
        inflight: Callable[[], int],
        queue_jobs: int = QUEUE_JOBS,
    ) -> None:
        """`router`: where the shadow label's version is found; `inflight()`: the model's predicts in flight now
        (the Predictor's count)."""
        self.manager, self.router, self.metrics = manager, router, metrics
        self._inflight, self.queue_jobs = inflight, queue_jobs
        self._queue: deque[_Job] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        # The versions whose counter exists: weakly held, so an unloaded version is forgotten with it, and its
        # counter is created at 0 again should its number come back (the manager drops the series).
        self._scored_versions: weakref.WeakSet[LoadedVersion] = weakref.WeakSet()
        self.stopped = False

    def offer(
        self,
        request: DecodedRequest,
        request_id: str | None,
        request_log: RequestLog | None = None,
        logged_at: float | None = None,
    ) -> None:
        """Queue the answered, unlabelled `request` the router chose to shadow; never blocks or raises
        (called on the predict path after the answer is made). `logged_at`: the time of the primary line
        `request_log` wrote (None: none was written, and no shadow line will be)."""
        try:
            if self.stopped:
                return
            servable = self._shadow_version()
            if servable is None:
                self._drop("unavailable")
                return
            if servable not in self._scored_versions:  # its counter exists at 0 from its first job
                self._scored_versions.add(servable)
                self.metrics.shadow_scored.inc(self.manager.name, str(servable.version), amount=0)
            if len(self._queue) >= self.queue_jobs:
                self._drop("queue_full")
                return
            self._queue.append(_Job(request, request_id, logged_at, request_log))
            if self._task is None or self._task.done():  # first job, or a worker that died
                # An empty context: the worker must not inherit the first request's trace span.
                self._task = asyncio.get_running_loop().create_task(
                    self._work(), context=contextvars.Context()
                )
            elif self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)
        except Exception:  # a bug here must never reach the client's answer
            limited.log(logging.ERROR, "offer", "shadow scoring failed to queue a request", exc_info=True)

    def stop(self) -> None:
        """Drop the queue and stop the worker (the server is shutting down)."""
        self.stopped = True
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _shadow_version(self) -> LoadedVersion | None:
        return self.router.labelled(SHADOW_LABEL)

    def _drop(self, reason: str, n: int = 1) -> None:
        self.metrics.shadow_dropped.inc(self.manager.name, reason, amount=n)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._waiter = loop.create_future()
                await self._waiter
                await asyncio.sleep(
                    GATHER_S
                )  # a few more jobs queue meanwhile: one model call scores them all
                continue
            jobs = self._take()
            try:
                await self._score(jobs)
            except Exception:  # never let one batch end the worker
                self._drop("error", len(jobs))
                limited.log(logging.ERROR, "score", "shadow scoring failed", exc_info=True)
            await asyncio.sleep(0)  # requests that became ready meanwhile go first

    def _take(self) -> list[_Job]:
        """The queued jobs of the first one's signature, up to BATCH_ROWS rows (a larger job goes alone)."""
        jobs = [self._queue.popleft()]
        signature, rows = jobs[0].request.signature, len(jobs[0].request.batch)
        while self._queue and self._queue[0].request.signature == signature:
            n = len(self._queue[0].request.batch)
            if rows + n > BATCH_ROWS:
                break
            jobs.append(self._queue.popleft())
            rows += n
        return jobs

    async def _score(self, jobs: list[_Job]) -> None:
        """Score `jobs` (one signature) in one call of the shadow version; log each one's scores."""
        servable = self._shadow_version()
        if servable is None:
            self._drop("unavailable", len(jobs))
            return
        if self._inflight() > BUSY_INFLIGHT:
            self._drop("busy", len(jobs))
            return
        signature, key = servable.backend.signature, jobs[0].request.signature
        self.manager.acquire(servable)  # a version retired meanwhile stays loaded until this batch is done
        try:
            parts = [job.request.batch for job in jobs]
            if key != RAW_SIGNATURE and any(cast(np.ndarray, b).shape[1] != signature.width for b in parts):
                raise InvalidArgument(f"the shadow version takes {signature.width} features a row")
            call = signature_calls(servable.backend).get(key)
            if call is None:
                raise InvalidArgument(f'the shadow version has no signature "{key}"')
            batch = parts[0] if len(parts) == 1 else call.concat(parts)
            if (
                len(batch) <= INLINE_MAX_ROWS
            ):  # a few rows: the model call alone, on the loop, as a runner does
                started = time.perf_counter()
                outputs = call.predict(batch if call.prepare is None else call.prepare(batch))
                elapsed_us = (time.perf_counter() - started) * 1e6
                runtime = servable.backend.runtime
                self.metrics.runtime_latency.observe(elapsed_us, self.manager.name, "predict", runtime)
            else:  # more: the version's runner (its batcher, or the inference thread)
                outputs = await servable.run(DecodedRequest(key, batch), watched=False)
            scores = signature.score(outputs)
        except Overloaded:
            self._drop("busy", len(jobs))
            return
        except Exception as exc:
            self._drop("error", len(jobs))
            limited.log(
                logging.WARNING,
                "error",
                "shadow version %d of %s failed on a request (the client had its answer): %s",
                servable.version,
                self.manager.name,
                exc,
            )
            return
        finally:
            self.manager.release(servable)
        start, scored = 0, 0
        for job in jobs:
            n = len(job.request.batch)
            part, start = scores[start : start + n], start + n
            if not np.isfinite(part).all():
                self._drop("non_finite")
                continue
            scored += 1
            if job.request_log is not None and job.logged_at is not None and job.request_id is not None:
                job.request_log.record_shadow(
                    job.request_id, job.logged_at, self.manager.name, servable.version, part
                )
        if scored and not servable.closed:  # an unloaded version's series is gone (forget)
            self.metrics.shadow_scored.inc(self.manager.name, str(servable.version), amount=scored)
