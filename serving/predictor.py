"""The predict path shared by REST and gRPC: resolve the version, validate, run (batched or not), count."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from serving.backends import Signature
from serving.batching import INLINE_MAX_ROWS
from serving.errors import ServingError, Unavailable
from serving.metrics import ServingMetrics
from serving.validation import Limits, check_batch
from serving.versions import LoadedVersion, ModelManager


class Predictor:
    """Runs predict requests against the manager's versions and keeps the request metrics."""

    def __init__(
        self, manager: ModelManager, limits: Limits, metrics: ServingMetrics, executor: Executor
    ) -> None:
        self.manager, self.limits, self.metrics, self._executor = manager, limits, metrics, executor
        self.draining = False
        self.inflight = 0  # exported by the ctr_serving_inflight_requests gauge at scrape time
        metrics.inflight.track(lambda: float(self.inflight), manager.name)

    async def predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        decode: Callable[[Signature], np.ndarray],
        entrypoint: str,
    ) -> tuple[np.ndarray, LoadedVersion]:
        """Predict for one request.

        Args:
            name, version, label: the model spec of the request.
            decode: turns the request body into a float32 (N, F) batch for the version's signature.
            entrypoint: "REST" or "GRPC" (metric label).
        Returns:
            the (N, K) scores and the version that produced them.
        """
        started = time.perf_counter()
        model_label = name if name == self.manager.name else "unknown"  # bounded label cardinality
        status = "INTERNAL"
        try:
            if self.draining:
                raise Unavailable("the server is shutting down; retry on another replica")
            lv = self.manager.resolve(name, version, label)
            features = decode(lv.backend.signature)
            check_batch(
                features, lv.backend.signature, self.limits, "row" if entrypoint == "GRPC" else "instance"
            )
            scores = await self._run(lv, features)
            status = "OK"
            return scores, lv
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

    async def _run(self, lv: LoadedVersion, features: np.ndarray) -> np.ndarray:
        self.manager.acquire(lv)
        self.inflight += 1
        try:
            if lv.batcher is not None:
                scores = await lv.batcher.submit(features)
            else:
                started = time.perf_counter()
                if len(features) <= INLINE_MAX_ROWS:
                    scores = lv.backend.predict(features)
                else:
                    scores = await asyncio.get_running_loop().run_in_executor(
                        self._executor, lv.backend.predict, features
                    )
                elapsed_us = (time.perf_counter() - started) * 1e6
                self.metrics.runtime_latency.observe(
                    elapsed_us, self.manager.name, "predict", lv.backend.runtime
                )
        finally:
            self.inflight -= 1
            self.manager.release(lv)
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
