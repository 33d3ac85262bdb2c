"""Dynamic batching, as TF Serving and Triton do it: merge concurrent requests into one model call.

A batch closes when it holds `max_batch_size` rows or when its oldest request has waited
`batch_timeout_micros` (0: take whatever queued while the previous batch ran, which batches by itself
under load and adds no wait when idle). The queue is bounded (`max_enqueued_batches` full batches); a request that does
not fit is refused at once with 429 instead of piling up latency. One batch runs at a time; a large one runs in a
worker thread, so the event loop keeps parsing the next requests while the model runs (ORT releases the GIL).

What a version's runner reports of each model call (BatchWatch) is the watching done once a batch, not once a
request. The predicted-CTR histogram and the drift window see every row the model scored, and Triton's statistics
count executions, rows, queue and compute time: all are fed from the batch the runner ran (a dynamic
batcher's merged requests, or one request when batching is off), in one call each. A single raw row at 64
connections comes in batches of tens, and what was a histogram update, a drift entry and a statistics update
per request is one of each per batch (the predictor still counts each request's success, decode and answer
time: serving/observability/model_stats.py). Only the `ctr` output is watched, whatever else a version
serves, and a batch with a score that is not finite is not watched at all: the requests with such a score are
refused (serving/dataplane/output_check.py) and no NaN reaches a histogram or the window. A shadow version's
batches are not the model's answers and are run unwatched (`watched=False`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from serving.errors import DeadlineExceeded, Overloaded, ServingError
from serving.observability import tracing
from serving.observability.drift import DriftMonitor
from serving.observability.metrics import ServingMetrics
from serving.observability.model_stats import ModelStatistics, StatisticsRow
from serving.signatures import Signature

log = logging.getLogger(__name__)
# Model calls up to this many rows run on the event loop: a call of up to 64 rows of this MLP (~60 µs with
# its transform) costs less than the hand-over to a worker thread and back (a queue, a futex wake, the loop's
# self-pipe). Single raw rows at 64 connections, one worker, 2 cores (2026-12-05): 16 -> 64 took the server's
# CPU from 32.6 to 29.3 µs a request and its p99 from 7.3 to 4.5 ms. Bigger ones (ranking requests) go to
# the thread so the loop keeps serving others meanwhile.
INLINE_MAX_ROWS = 64
FEW_SCORES = 16  # up to this many, Python's isfinite over a list costs less than numpy's per-call overhead


class BatchWatch:
    """The watching of one signature of one version: `answered(batch, scores)` after each model call."""

    __slots__ = (
        "_drift",
        "_histogram",
        "_model",
        "_observe_ctr",
        "_off",
        "_row",
        "_signature",
        "_signature_key",
        "_stats",
        "_version",
    )

    def __init__(
        self,
        model_name: str,
        version: int,
        signature: Signature,
        signature_key: str,
        metrics: ServingMetrics,
        drift: DriftMonitor | None,
        statistics: ModelStatistics | None,
    ) -> None:
        """`signature`: the version's outputs (its `ctr` columns are watched); `signature_key`: the signature
        the runner serves (`serving_default` features or `raw` rows); `drift`: the model's drift window (None:
        `--drift_window 0`); `statistics`: Triton's statistics (None: `--model_statistics=false`)."""
        self._model, self._version = model_name, version
        self._signature, self._signature_key = signature, signature_key
        self._histogram, self._drift, self._stats = metrics.predicted_ctr, drift, statistics
        self._observe_ctr = metrics.predicted_ctr.labels(model_name)
        self._row: StatisticsRow | None = None  # the version's statistics row, found at the first batch
        self._off = False  # its counting failed once: nothing more is counted (`answered`)

    def answered(
        self,
        batch: Any,
        scores: np.ndarray,
        requests: int,
        queued_ns: int,
        ran_ns: int,
        answers: list[tuple[Any, np.ndarray]] | None = None,
    ) -> None:
        """The model scored `batch` (before any transform) as `scores` (N, K), for `requests` requests that
        waited `queued_ns` in all, in a call of `ran_ns` (transform and model): count the execution, the
        `ctr` column in the histogram and keep the rows in the drift window. `answers`: the (rows, scores) of
        the requests whose scores are the model's answers, when some of the call's are not (a shadow
        version's); None: all are. Never raises: the batch's requests have their scores whatever happens here,
        and a failure is logged once and turns off what failed (the drift window, or the rest of this
        version's watching)."""
        if self._off:
            return
        try:
            self._executed(len(scores), requests, queued_ns, ran_ns)
            if answers is None:
                ctr = self._counted(scores)
                watched = [] if ctr is None else [(batch, ctr)]
            else:
                watched = [(rows, ctr) for rows, part in answers if (ctr := self._counted(part)) is not None]
        except Exception:
            log.exception(
                "statistics and the predicted-CTR histogram of %s version %d are off from now on: they failed "
                "on a batch",
                self._model,
                self._version,
            )
            self._off = True
            return
        if self._drift is not None:
            try:
                for rows, ctr in watched:
                    self._drift.observe_batch(self._signature_key, rows, ctr)
            except Exception:
                log.exception("drift tracking of %s is off from now on: it failed on a batch", self._model)
                self._drift = None

    def _executed(self, rows: int, requests: int, queued_ns: int, ran_ns: int) -> None:
        stats = self._stats
        if stats is not None:
            row = self._row
            if row is None:
                row = self._row = stats.row(self._model, self._version, self._signature_key)
            stats.executed(row, rows, requests, queued_ns, ran_ns)

    def _counted(self, scores: np.ndarray) -> np.ndarray | None:
        """Count the `ctr` scores in the histogram; returns them, or None when one is not finite."""
        ctr = self._signature.score(scores) if self._signature.extra_outputs else scores
        if (
            ctr.size <= FEW_SCORES
        ):  # a few (a canary's batch, batching off): in Python, no numpy call's fixed cost
            values = ctr.ravel().tolist()
            if not all(map(math.isfinite, values)):
                return None
            for value in values:
                self._observe_ctr(value)
        elif np.isfinite(ctr).all():
            self._histogram.observe_many(ctr, self._model)
        else:
            return None
        return ctr


def all_finite(scores: np.ndarray) -> bool:
    """Whether every score is finite: a few by Python's isfinite over a list (numpy's `isfinite().all()` has a
    fixed cost of a few µs), more by numpy."""
    if scores.size <= FEW_SCORES:
        return all(map(math.isfinite, scores.ravel().tolist()))
    return bool(np.isfinite(scores).all())


class _Pending:
    """One queued request of the batcher (a plain slotted class: one is made per request)."""

    __slots__ = (
        "deadline",
        "enqueued",
        "features",
        "future",
        "queued_s",
        "span",
        "watched",
    )

    def __init__(
        self, features: Any, future: asyncio.Future[np.ndarray], enqueued: float, deadline: float
    ) -> None:
        self.features = features  # one signature's batch: np.ndarray (n, F), or a RawBatch (`raw` signature)
        self.future = future
        self.enqueued = enqueued  # perf_counter seconds
        self.deadline = deadline
        self.queued_s = 0.0  # its wait, once taken into a batch
        self.span: Any = None  # its request's span when traced (serving/observability/tracing.py)
        self.watched = True  # its rows are the model's answers (a shadow version's are not: BatchWatch)


class DynamicBatcher:
    """Queue of pending requests for one signature of one model version, drained by one batching task.

    `run` maps one batch of the signature to its scores; `concat` joins the batches of several requests
    (np.concatenate for features, RawBatch.concat for raw rows); `prepare`, when given, turns the joined
    batch into `run`'s input on the event loop (the raw rows' FeatureSpec transform).
    """

    def __init__(
        self,
        run: Callable[[Any], np.ndarray],
        *,
        concat: Callable[[list[Any]], Any] = np.concatenate,
        prepare: Callable[[Any], Any] | None = None,
        max_batch_size: int,
        batch_timeout_s: float,
        max_enqueued_batches: int,
        timeout_s: float,
        executor: Executor | None,
        metrics: ServingMetrics,
        model_name: str,
        runtime: str,
        watch: BatchWatch | None = None,
    ) -> None:
        """`watch`: told of every batch the model scored (BatchWatch; None: nothing is)."""
        self._run, self._concat, self._executor, self._metrics = run, concat, executor, metrics
        self._watch = watch
        self._prepare = prepare  # run on the loop before `run` (servable.SignatureCall.prepare)
        self._model, self._runtime = model_name, runtime
        self.max_batch_size, self._batch_timeout_s, self._timeout_s = (
            max_batch_size,
            batch_timeout_s,
            timeout_s,
        )
        self.max_queued_rows = max_batch_size * max_enqueued_batches
        self._queue: deque[_Pending] = deque()
        self.queued_rows = 0
        self._waiter: asyncio.Future[None] | None = None
        self._wake_at_rows = 1  # 1 while idle; max_batch_size while holding a batch open
        self._task: asyncio.Task[None] | None = None
        # The loop, taken at the first request: asyncio.get_running_loop() makes a getpid() system call.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._traced: list[Any] = []  # the sampled requests' spans of the batch being taken (tracing on)

    async def run(self, batch: Any, watched: bool = True, span: Any = None) -> np.ndarray:
        """Queue `batch` and wait for its scores (the servable's runner interface); `watched`: its rows count
        as the model's answers (BatchWatch); `span`: the request's span when it is traced."""
        item = self._enqueue(batch)
        if not watched:
            item.watched = False
        item.span = span
        return await item.future

    @property
    def batch_timeout_s(self) -> float:
        return self._batch_timeout_s

    def submit(self, features: Any) -> asyncio.Future[np.ndarray]:
        """Enqueue one request of shape (n, F); its future resolves to the (n, K) scores.

        Raises:
            Overloaded: the queue has no room for n more rows.
        """
        return self._enqueue(features).future

    def _enqueue(self, features: Any) -> _Pending:
        n = len(features)
        if self.queued_rows + n > self.max_queued_rows and self._queue:
            raise Overloaded(
                f"batching queue is full ({self.queued_rows} rows queued, limit {self.max_queued_rows}); "
                "retry later"
            )
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._drain_forever())
        now = time.perf_counter()
        item = _Pending(features, loop.create_future(), now, now + self._timeout_s)
        self._queue.append(item)
        self.queued_rows += n
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self.queued_rows >= self._wake_at_rows:
            waiter.set_result(None)
        return item

    def close(self) -> None:
        """Stop the batching task (the version is unloaded; its queue is empty by then) and let go of it: a
        cancelled task keeps its CancelledError, whose traceback holds the task's frame, whose `self` is this
        batcher, so a reference to the task would keep the version's model alive until a full collection."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(ServingError("model version was unloaded"))
        self._queue.clear()
        self.queued_rows = 0

    async def _wait(self, wake_at_rows: int, delay_s: float | None) -> None:
        loop = self._loop
        assert loop is not None  # the batching task is started by the first request
        self._wake_at_rows, self._waiter = wake_at_rows, loop.create_future()
        timer = None if delay_s is None else loop.call_later(delay_s, _resolve, self._waiter)
        await self._waiter
        if timer is not None:
            timer.cancel()

    async def _drain_forever(self) -> None:
        while True:
            if not self._queue:
                await self._wait(1, None)
            if self.queued_rows < self.max_batch_size and self._batch_timeout_s > 0:
                delay = self._queue[0].enqueued + self._batch_timeout_s - time.perf_counter()
                if delay > 0:
                    await self._wait(self.max_batch_size, delay)
            batch = self._take_batch()
            if batch:
                await self._execute(batch)

    def _take_batch(self) -> list[_Pending]:
        """Pop requests up to max_batch_size rows (a single larger request runs alone)."""
        batch: list[_Pending] = []
        rows = 0
        now = time.perf_counter()
        while self._queue and (not batch or rows + len(self._queue[0].features) <= self.max_batch_size):
            item = self._queue.popleft()
            self.queued_rows -= len(item.features)
            if item.future.done():  # the client went away (gRPC cancellation)
                continue
            if now > item.deadline:
                item.future.set_exception(
                    DeadlineExceeded(
                        f"request waited {now - item.enqueued:.3f}s in the batching queue, over the "
                        f"{self._timeout_s * 1e3:.0f} ms deadline (--rest_api_timeout_in_ms)"
                    )
                )
                continue
            item.queued_s = now - item.enqueued
            if item.span is not None:
                tracing.child(item.span, "queue_wait", item.enqueued, now)
                self._traced.append(item.span)
            self._metrics.queuing_latency.observe(item.queued_s * 1e6, "batch_threads")
            batch.append(item)
            rows += len(item.features)
        return batch

    async def _execute(self, batch: list[_Pending]) -> None:
        # (sum n_i, F) -> (sum n_i, K), then split back per request.
        parts = [b.features for b in batch]
        features = merged = parts[0] if len(parts) == 1 else self._concat(parts)
        self._metrics.batch_size.observe(len(features), self._model)
        started = time.perf_counter()
        traced = self._traced  # filled by _take_batch; mostly empty, and then left as it is
        if traced:
            self._traced = []
        try:
            if self._prepare is not None:
                features = self._prepare(features)
            prepared = time.perf_counter()
            if len(features) <= INLINE_MAX_ROWS:
                # A few rows on the loop cost less than a thread hop; requests keep queueing meanwhile anyway.
                scores = self._run(features)
            else:
                assert self._loop is not None
                scores = await self._loop.run_in_executor(self._executor, self._run, features)
        except Exception as exc:  # the runtime failed: every request of the batch gets the error
            log.exception("batch of %d rows failed", len(features))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(ServingError(f"model execution failed: {exc}"))
            return
        ran = time.perf_counter()
        self._metrics.runtime_latency.observe((ran - started) * 1e6, self._model, "predict", self._runtime)
        if traced:
            _trace_batch(traced, started, prepared if self._prepare is not None else None, ran, len(features))
        start = 0
        unwatched = False
        for item in batch:
            end = start + len(item.features)
            if not item.future.done():
                item.future.set_result(scores[start:end])
            unwatched |= not item.watched
            start = end
        if self._watch is not None:
            queued_ns = int(sum(item.queued_s for item in batch) * 1e9)
            # One execution of every request's rows; a shadow version's requests among them are not answers.
            answers = _answers(batch, scores) if unwatched else None
            self._watch.answered(merged, scores, len(batch), queued_ns, int((ran - started) * 1e9), answers)


def _trace_batch(spans: list[Any], started: float, prepared: float | None, ran: float, rows: int) -> None:
    """The batch's span (linked to each traced request) with its transform and model run as children."""
    span = tracing.batch(spans, started, ran, rows)
    if prepared is not None:
        tracing.child(span, "transform", started, prepared)
    tracing.child(span, "model_run", prepared or started, ran)


def _answers(batch: list[_Pending], scores: np.ndarray) -> list[tuple[Any, np.ndarray]]:
    """The (rows, scores) of the batch's watched requests."""
    found, start = [], 0
    for item in batch:
        end = start + len(item.features)
        if item.watched:
            found.append((item.features, scores[start:end]))
        start = end
    return found


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
