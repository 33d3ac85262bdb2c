"""The predict path shared by REST and gRPC: route once, decode for the routed version, validate, run, check, observe."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, cast

import numpy as np

from serving.dataplane.output_check import check_outputs
from serving.dataplane.shadow import ShadowScorer
from serving.dataplane.validation import Limits
from serving.errors import (
    DeadlineExceeded,
    InvalidArgument,
    ServingError,
    Unavailable,
    check_deadline,
)
from serving.observability import tracing
from serving.observability.drift import DriftMonitor
from serving.observability.metrics import ServingMetrics
from serving.observability.model_stats import RequestTiming
from serving.observability.request_log import RequestLog
from serving.repository.manager import ModelManager
from serving.requests import DecodedRequest
from serving.routing.route import Route
from serving.routing.router import Router
from serving.runtime.batcher import all_finite
from serving.runtime.servable import LoadedVersion
from serving.signatures import RAW_SIGNATURE, Signature

log = logging.getLogger(__name__)
# A request's decode step for the routed version's signature: the request at once (a small body), or awaited.
Decode = Callable[[Signature], "DecodedRequest | Awaitable[DecodedRequest]"]


class Prediction(NamedTuple):
    """One answered predict: the scores (N, K), or (N, k * K) with every output of the version side by side
    (serving/signatures.py), the version that made them, and the request it ran."""

    scores: np.ndarray
    servable: LoadedVersion
    request: DecodedRequest
    ctr: np.ndarray  # the `ctr` columns of `scores` (`scores` itself for a one-output version)
    fallback: str | None = None  # why the last good version answered (serving/routing/fallback.py)
    # How the version was chosen (serving/routing/router.py): "stable", "latest" or "canary" for a request
    # naming no version or label, "version" or "label" for one that names it.
    route: str = "latest"


class Predictor:
    """Runs predict requests against the router's versions and keeps the request metrics."""

    def __init__(
        self,
        manager: ModelManager,
        router: Router,
        limits: Limits,
        metrics: ServingMetrics,
        drift: DriftMonitor | None = None,
        request_log: RequestLog | None = None,
        statistics: bool = True,
    ) -> None:
        """`router`: the model's routing, which `manager` tells of its versions; `drift`, `request_log`: what
        watches the answered requests (serving/observability/drift.py and request_log.py; None: off);
        `statistics`: keep Triton's statistics of each predict (serving/observability/model_stats.py)."""
        self.manager, self.router, self.limits, self.metrics = manager, router, limits, metrics
        self.drift, self.request_log, self.statistics = drift, request_log, statistics
        self.draining = False
        self.inflight = 0  # exported by the ctr_serving_inflight_requests gauge at scrape time
        metrics.inflight.track(lambda: float(self.inflight), manager.name)
        self._breakers = router.fallback  # None: no circuit breaking, nothing counted per request
        # A sampled share of unlabelled requests scored again by the `shadow` label's version, off the path.
        self.shadow = ShadowScorer(manager, router, metrics, lambda: self.inflight)

    async def predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        decode: Decode,
        entrypoint: str,
        request_id: str | None = None,
        inputs: Callable[[], Any] | None = None,
        deadline: float | None = None,
    ) -> Prediction:
        """Predict for one request: route, decode, validate, run, check outputs, observe; the protocol encodes.

        Args:
            name, version, label: the model spec of the request.
            decode: turns the request into a DecodedRequest for the routed version's signature (at once, or
                awaited: a large body decodes in a child process).
            entrypoint: "REST" or "GRPC" (metric label).
            request_id: the request's id, for the traffic split (a random choice when the client sent none)
                and the request log; None: not logged.
            inputs: the request's inputs as the client sent them, for the request log (default: the batch).
            deadline: the request's deadline, time.monotonic() seconds (None: none); once passed, no work starts.
        Returns:
            the scores, the version that produced them and the decoded request.
        """
        # Triton's statistics of the request (None: off), whose start is the request's.
        timing = RequestTiming() if self.statistics else None
        started = time.perf_counter_ns() if timing is None else timing.start
        status = "INTERNAL"
        route: Route | None = None
        request: DecodedRequest | None = None
        span = tracing.current() if tracing.ACTIVE else None  # the request's span, when sampled
        try:
            if self.draining:
                raise Unavailable("the server is shutting down; retry on another replica")
            if deadline is not None:
                check_deadline(deadline, "its work started")
            route = self.router.route(name, version, label, request_id)
            while True:  # a routed request that fails runs once more, on the last good version
                try:
                    request, scores = await self._run(route, decode, entrypoint, deadline, timing, span)
                    if self._breakers is not None:
                        self.router.succeeded(route.primary.version, deadline)
                    break
                except BaseException as exc:
                    retry = None if self._breakers is None else self._breakers.failed(route, exc, deadline)
                    if retry is None:
                        raise
                    route = retry
            status = "OK"
            ctr = self._observe(route, request, scores, request_id, inputs, label)
            return Prediction(scores, route.primary, request, ctr, route.fallback, route.why)
        except ServingError as exc:
            status = exc.code
            raise
        except asyncio.CancelledError:  # the gRPC client cancelled or its deadline passed: not a server error
            status = "CANCELLED"
            raise
        finally:
            model_label = name if name == self.manager.name else "unknown"  # bounded label cardinality
            self.metrics.request_count.inc(model_label, status)
            if span is not None:
                tracing.status(span, status)
            end = time.perf_counter_ns()
            self.metrics.request_latency.observe((end - started) / 1e3, model_label, "predict", entrypoint)
            # An unloaded version's rows are gone.
            if timing is not None and route is not None and not route.primary.closed:
                self.metrics.model_stats.record(
                    self.manager.name, route.primary.version, request, timing, status, end
                )

    async def _run(
        self,
        route: Route,
        decode: Decode,
        entrypoint: str,
        deadline: float | None,
        timing: RequestTiming | None,
        span: Any,
    ) -> tuple[DecodedRequest, np.ndarray]:
        """Decode, validate and run the request on `route.primary`, then check its scores."""
        servable = route.primary
        # Held from here: a version retired while a large body decodes stays loaded until it answers.
        servable.inflight += 1
        self.inflight += 1
        try:
            decode_start = time.perf_counter() if span is not None else 0.0
            decoded = decode(servable.backend.signature)
            request = decoded if type(decoded) is DecodedRequest else await cast(Awaitable, decoded)
            if timing is not None:
                timing.decoded = time.perf_counter_ns()
            if span is not None:
                tracing.child(span, "decode", decode_start)
                tracing.annotate(
                    span, self.manager.name, servable.version, request.signature, len(request.batch)
                )
            check_request(request, servable.backend.signature, self.limits, _unit(entrypoint))
            if deadline is not None:
                check_deadline(deadline, "the model ran")
            # The runner of the request's signature (serving/runtime/servable.py); `LoadedVersion.run` says
            # why there is none.
            runner = servable.runners.get(request.signature)
            run = servable.run(request) if runner is None else runner.run(request.batch, True, span)
            if deadline is None or entrypoint != "REST":  # gRPC cancels its own at the deadline
                scores = await run
            else:  # cut at the deadline: a run still queued in the batcher is dropped from it
                scores = await _until(run, deadline)
            if timing is not None:
                timing.ran = time.perf_counter_ns()
        finally:
            self.inflight -= 1
            if servable.retired:  # the last request on a retired version unloads it
                self.manager.release(servable)
            else:
                servable.inflight -= 1
        # No NaN leaves, nor is observed: the output check (and the ranges) only when a score is not finite.
        if not all_finite(scores):
            features = None if request.signature == RAW_SIGNATURE else cast(np.ndarray, request.batch)
            check_outputs(
                scores, self.metrics, self.manager.name, _unit(entrypoint), features, servable.ranges
            )
        return request, scores

    def _observe(
        self,
        route: Route,
        request: DecodedRequest,
        scores: np.ndarray,
        request_id: str | None,
        inputs: Callable[[], Any] | None,
        label: str | None,
    ) -> np.ndarray:
        """Feed the request log and shadow scoring (the version's runner fed the predicted-CTR histogram and
        drift with its batch: serving/runtime/batcher.py). Returns the `ctr` columns."""
        sig = route.primary.backend.signature  # `ctr` alone is logged, whatever else is served
        ctr = sig.score(scores) if sig.extra_outputs else scores
        logged_at = None
        if self.request_log is not None and request_id is not None:
            logged_at = self._log(route, request, ctr, request_id, inputs, label)
        if route.shadow:
            self.shadow.offer(request, request_id, self.request_log, logged_at)
        return ctr

    def drift_text(self) -> str:
        """The drift gauges (serving/observability/drift.py) for the metrics page; empty with `--drift_window 0`."""
        return self.drift.render() if self.drift is not None else ""

    def _log(
        self,
        route: Route,
        request: DecodedRequest,
        scores: np.ndarray,
        request_id: str,
        inputs: Callable[[], Any] | None,
        label: str | None,
    ) -> float | None:
        """Feed the request log; a failure here is logged and never fails the predict. Returns the time of the
        request's log line (None: not logged)."""
        why = route.why
        try:
            if self.request_log is not None:
                return self.request_log.record(
                    request_id,
                    self.manager.name,
                    route.primary.version,
                    inputs or request.logged_inputs,
                    scores,
                    label if why == "label" else why if why in ("stable", "canary") else None,
                    why == "canary",
                    route.fallback,
                )
        except Exception:
            log.exception("request logging is off from now on: it failed on a request")
            self.request_log = None
        return None

    async def drain(self, grace_s: float) -> bool:
        """Refuse new requests and wait up to `grace_s` for in-flight ones; True when all finished."""
        self.draining = True
        self.shadow.stop()
        deadline = time.monotonic() + grace_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling keeps the request path free of Event bookkeeping
        return self.inflight == 0


async def _until(run: Awaitable[np.ndarray], deadline: float) -> np.ndarray:
    """`run`'s scores, or DeadlineExceeded once `deadline` (time.monotonic()) passes first."""
    try:
        return await asyncio.wait_for(run, max(deadline - time.monotonic(), 0.0))
    except TimeoutError:
        raise DeadlineExceeded(
            "the model did not answer within the request's x-request-timeout-ms; retry with a longer timeout"
        ) from None


def _unit(entrypoint: str) -> str:
    """What one row is called in messages: a REST `instance`, a gRPC tensor's `row`."""
    return "row" if entrypoint == "GRPC" else "instance"


def check_request(request: DecodedRequest, sig: Signature, limits: Limits, unit: str = "instance") -> None:
    """Raise InvalidArgument unless the request's batch is non-empty and within limits; features also finite (N, F).

    Args:
        request: the decoded request; its batch is (N, sig.width) float32 features or a raw batch.
        sig: the served version's signature.
        limits: the server's request limits.
        unit: what one row is called in messages ("instance" for REST, "row" for gRPC tensors).
    """
    batch = request.batch
    raw = request.signature == RAW_SIGNATURE
    if not raw:
        shape = cast(np.ndarray, batch).shape
        if len(shape) != 2 or shape[1] != sig.width:
            raise InvalidArgument(
                f"input '{sig.input_name}' has shape {list(shape)}, expected [N, {sig.width}]"
            )
    n = len(batch)
    if n == 0:
        if raw:
            raise InvalidArgument(
                f"empty batch: no {unit}s for signature '{RAW_SIGNATURE}'; send at least one"
            )
        # The two APIs' wordings, kept as clients have seen them.
        raise InvalidArgument(
            f"empty batch: no instances for input '{sig.input_name}'; send at least one"
            if unit == "instance"
            else f"empty batch: input '{sig.input_name}' has no {unit}s; send at least one"
        )
    if n > limits.max_instances:
        raise InvalidArgument(
            f"batch of {n} {unit}s is over the limit of {limits.max_instances} (--max_instances); split it"
        )
    if not raw and not limits.allow_nonfinite:
        _check_finite(cast(np.ndarray, batch), unit)


def _check_finite(features: np.ndarray, unit: str) -> None:
    finite = np.isfinite(features)
    if not finite.all():
        row, col = (int(i) for i in np.argwhere(~finite)[0])
        raise InvalidArgument(
            f"{unit} {row} feature {col} is {features[row, col]} (not finite in float32); NaN and Inf are "
            "rejected (start the server with --allow_nonfinite to accept them)"
        )
