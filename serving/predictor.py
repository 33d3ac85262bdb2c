"""The predict path shared by REST and gRPC: resolve the version, validate, run (batched or not), count."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from serving.batching import INLINE_MAX_ROWS
from serving.drift import DriftMonitor
from serving.errors import ServingError, Unavailable
from serving.metrics import ServingMetrics
from serving.output_check import check_outputs
from serving.raw_codec import RawBatch, check_raw_batch
from serving.request_log import RequestLog
from serving.signatures import Signature
from serving.validation import Limits, check_batch
from serving.versions import LoadedVersion, ModelManager

log = logging.getLogger(__name__)


class Predictor:
    """Runs predict requests against the manager's versions and keeps the request metrics."""

    def __init__(
        self, manager: ModelManager, limits: Limits, metrics: ServingMetrics, executor: Executor
    ) -> None:
        self.manager, self.limits, self.metrics, self._executor = manager, limits, metrics, executor
        self.draining = False
        self.inflight = 0  # exported by the ctr_serving_inflight_requests gauge at scrape time
        metrics.inflight.track(lambda: float(self.inflight), manager.name)
        metrics.nonfinite_outputs.inc(
            manager.name, amount=0
        )  # present from the start: alerts see 0, not no data
        self.drift: DriftMonitor | None = None  # the server sets these two (serving/drift.py, request_log.py)
        self.request_log: RequestLog | None = None

    async def predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        decode: Callable[[Signature], np.ndarray | RawBatch],
        entrypoint: str,
        request_id: str | None = None,
        inputs: Callable[[], Any] | None = None,
    ) -> tuple[np.ndarray, LoadedVersion]:
        """Predict for one request.

        Args:
            name, version, label: the model spec of the request.
            decode: turns the request body into a float32 (N, F) batch for the version's signature.
            entrypoint: "REST" or "GRPC" (metric label).
            request_id: the request's id, for the request log; None: not logged.
            inputs: the request's inputs as the client sent them, for the request log (default: the batch).
        Returns:
            the (N, K) scores and the version that produced them.
        """
        started = time.perf_counter()
        model_label = name if name == self.manager.name else "unknown"  # bounded label cardinality
        status = "INTERNAL"
        try:
            if self.draining:
                raise Unavailable("the server is shutting down; retry on another replica")
            servable = self.manager.resolve(name, version, label)
            features = decode(servable.backend.signature)
            unit = "row" if entrypoint == "GRPC" else "instance"
            if isinstance(features, RawBatch):
                check_raw_batch(features, self.limits, unit)
            else:
                check_batch(features, servable.backend.signature, self.limits, unit)
            scores = await self._run(servable, features, unit)
            status = "OK"
            if self.drift is not None or self.request_log is not None:
                self._watch(servable, features, scores, request_id, inputs)
            return scores, servable
        except ServingError as exc:
            status = exc.code
            raise
        except asyncio.CancelledError:  # the gRPC client cancelled or its deadline passed: not a server error
            status = "CANCELLED"
            raise
        finally:
            self.metrics.request_count.inc(model_label, status)
            elapsed_us = (time.perf_counter() - started) * 1e6
            self.metrics.request_latency.observe(elapsed_us, model_label, "predict", entrypoint)

    def drift_text(self) -> str:
        """The drift gauges (serving/drift.py) for the metrics page; empty with `--drift_window 0`."""
        return self.drift.render() if self.drift is not None else ""

    def _watch(
        self,
        servable: LoadedVersion,
        features: np.ndarray | RawBatch,
        scores: np.ndarray,
        request_id: str | None,
        inputs: Callable[[], Any] | None,
    ) -> None:
        """Feed the drift window and the request log; a failure here is logged and never fails the predict."""
        try:
            if self.drift is not None:  # feature vectors or a raw batch: serving/drift.py bins each kind
                self.drift.observe(features, scores)
            if self.request_log is not None and request_id is not None:
                self.request_log.record(
                    request_id,
                    self.manager.name,
                    servable.version,
                    inputs or (lambda: _logged_inputs(features)),
                    scores,
                )
        except Exception:
            log.exception("drift tracking and request logging are off from now on: they failed on a request")
            self.drift = self.request_log = None

    async def _run(self, servable: LoadedVersion, features: np.ndarray | RawBatch, unit: str) -> np.ndarray:
        self.manager.acquire(servable)
        self.inflight += 1
        try:
            batcher = servable.batcher if isinstance(features, np.ndarray) else servable.raw_batcher
            if batcher is not None:
                scores = await batcher.submit(features)
            else:
                run: Callable[[Any], np.ndarray] = (
                    servable.backend.predict if isinstance(features, np.ndarray) else raw_runner(servable)
                )
                started = time.perf_counter()
                if len(features) <= INLINE_MAX_ROWS:
                    scores = run(features)
                else:
                    scores = await asyncio.get_running_loop().run_in_executor(self._executor, run, features)
                elapsed_us = (time.perf_counter() - started) * 1e6
                self.metrics.runtime_latency.observe(
                    elapsed_us, self.manager.name, "predict", servable.backend.runtime
                )
        finally:
            self.inflight -= 1
            self.manager.release(servable)
        check_outputs(scores, self.metrics, self.manager.name, unit)  # before the histogram: no NaN in it
        if len(scores) == 1:
            self.metrics.predicted_ctr.observe(float(scores[0, 0]), self.manager.name)
        else:
            self.metrics.predicted_ctr.observe_many(scores, self.manager.name)
        return scores

    async def drain(self, grace_s: float) -> bool:
        """Refuse new requests and wait up to `grace_s` for in-flight ones; True when all finished."""
        self.draining = True
        deadline = time.monotonic() + grace_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling keeps the request path free of Event bookkeeping
        return self.inflight == 0


def _logged_inputs(features: np.ndarray | RawBatch) -> dict[str, Any]:
    """The decoded batch for the request log: `instances` (features) or columnar `inputs` (raw)."""
    if isinstance(features, RawBatch):
        return {"inputs": {k: v.tolist() for k, v in features.inputs.items()}}
    return {"instances": features}


def raw_runner(servable: LoadedVersion) -> Callable[[RawBatch], np.ndarray]:
    """The version's `raw` signature as a function of a decoded RawBatch."""
    return lambda batch: servable.backend.predict_raw(batch.inputs)
