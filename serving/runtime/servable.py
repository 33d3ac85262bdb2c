"""A loaded version and how it runs a request: one runner per signature, batched or one request at a time.

The runner of a signature is a DynamicBatcher (`--enable_batching`) or a DirectRunner. Either way the
predict path only looks the runner up by the request's signature key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ctr_features.compiled.raw_batch import RawBatch
from serving.errors import InvalidArgument, Unavailable
from serving.observability import tracing
from serving.observability.drift import DriftMonitor
from serving.observability.metrics import ServingMetrics
from serving.observability.model_stats import ModelStatistics
from serving.requests import DecodedRequest
from serving.runtime.backends import Backend, close_backend
from serving.runtime.batcher import INLINE_MAX_ROWS, BatchWatch, DynamicBatcher
from serving.runtime.input_range import FeatureRanges
from serving.runtime.spec_backend import SpecBackend
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE


class Runner(Protocol):
    """Runs batches of one signature of one version."""

    async def run(self, batch: Any, watched: bool = True, span: Any = None) -> np.ndarray:
        """One batch -> its (N, K) scores; `watched`: the scores are the model's answers, which its BatchWatch
        sees (a shadow version's are not); `span`: the request's span when it is traced (None: it is not)."""
        ...

    def close(self) -> None:
        """The version is unloaded: stop."""
        ...


@dataclass(frozen=True)
class SignatureCall:
    """How one signature runs on a backend: the model call, how batches of it are joined, and the Python
    work done before the model call on the event loop (None: none)."""

    predict: Callable[[Any], np.ndarray]
    concat: Callable[[list[Any]], Any]
    prepare: Callable[[Any], Any] | None = None


def signature_calls(backend: Backend) -> dict[str, SignatureCall]:
    """The signatures `backend` serves, by signature key."""
    if isinstance(backend, SpecBackend):  # the FeatureSpec + the features model: no 39-input conversion
        # The runtime's own model call, not SpecBackend's forwarding one: a hop less per batch.
        model = backend.backend.predict
        # The transform holds the GIL (numpy on small arrays): on the inference thread it would only take
        # turns with the loop, each hand-over waiting on the other's Python code (up to the interpreter's
        # switch interval, sys.getswitchinterval()), so it runs on the loop and the thread gets only the
        # model call, which releases the GIL. A few rows go straight to the few-row transform.
        return {
            DEFAULT_SIGNATURE: SignatureCall(model, np.concatenate),
            RAW_SIGNATURE: SignatureCall(model, RawBatch.concat, backend.transform.serving_call()),
        }
    calls = {DEFAULT_SIGNATURE: SignatureCall(backend.predict, np.concatenate)}
    if backend.signature.has_raw:
        calls[RAW_SIGNATURE] = SignatureCall(lambda b: backend.predict_raw(b.inputs), RawBatch.concat)
    return calls


class DirectRunner:
    """Runs each request alone: a small one on the event loop, a large one on `executor`."""

    def __init__(
        self,
        predict: Callable[[Any], np.ndarray],
        executor: Executor | None,
        metrics: ServingMetrics,
        model_name: str,
        runtime: str,
        prepare: Callable[[Any], Any] | None = None,
        watch: BatchWatch | None = None,
    ) -> None:
        """`prepare`: run on the loop before `predict` (SignatureCall.prepare); `watch`: told of each
        request's scores (None: nothing is)."""
        self._predict, self._executor, self._metrics = predict, executor, metrics
        self._model, self._runtime, self._prepare = model_name, runtime, prepare
        self._watch = watch

    async def run(self, batch: Any, watched: bool = True, span: Any = None) -> np.ndarray:
        """One batch -> its scores, timed as the runtime's latency."""
        started = prepared = time.perf_counter()
        features = batch
        if self._prepare is not None:
            features = self._prepare(batch)
            prepared = time.perf_counter()
        if len(features) <= INLINE_MAX_ROWS:
            scores = self._predict(features)
        else:
            loop = asyncio.get_running_loop()
            scores = await loop.run_in_executor(self._executor, self._predict, features)
        ran = time.perf_counter()
        self._metrics.runtime_latency.observe((ran - started) * 1e6, self._model, "predict", self._runtime)
        if span is not None:  # one request, no batch: its transform and model run are its own children
            if self._prepare is not None:
                tracing.child(span, "transform", started, prepared)
            tracing.child(span, "model_run", prepared, ran, **{"ctr.batch_size": len(batch)})
        if self._watch is not None and watched:
            self._watch.answered(batch, scores, 1, 0, int((ran - started) * 1e9))
        return scores

    def close(self) -> None:
        """Nothing is queued: nothing to stop."""


@dataclass(frozen=True)
class BatchingOptions:
    """The `--enable_batching` settings a version's batchers get."""

    max_batch_size: int
    batch_timeout_s: float
    max_enqueued_batches: int
    timeout_s: float  # a request's deadline in the queue


def build_runners(
    backend: Backend,
    batching: BatchingOptions | None,
    executor: Executor | None,
    metrics: ServingMetrics,
    model_name: str,
    version: int = 0,
    drift: DriftMonitor | None = None,
    statistics: bool = True,
) -> dict[str, Runner]:
    """One runner per signature of `backend`: batchers (each signature queues apart), or direct runners; each
    tells a BatchWatch of the model's answers: the predicted-CTR histogram, `drift` (the model's drift
    window, None: off) and, with `statistics`, Triton's statistics of `version`'s executions."""
    runners: dict[str, Runner] = {}
    for key, call in signature_calls(backend).items():
        stats: ModelStatistics | None = metrics.model_stats if statistics else None
        watch = BatchWatch(model_name, version, backend.signature, key, metrics, drift, stats)
        if batching is None:
            runners[key] = DirectRunner(
                call.predict, executor, metrics, model_name, backend.runtime, call.prepare, watch
            )
        else:
            runners[key] = DynamicBatcher(
                call.predict,
                concat=call.concat,
                prepare=call.prepare,
                max_batch_size=batching.max_batch_size,
                batch_timeout_s=batching.batch_timeout_s,
                max_enqueued_batches=batching.max_enqueued_batches,
                timeout_s=batching.timeout_s,
                executor=executor,
                metrics=metrics,
                model_name=model_name,
                runtime=backend.runtime,
                watch=watch,
            )
    return runners


@dataclass(eq=False)  # an identity: one object per load, held in weak sets (serving/dataplane/shadow.py)
class LoadedVersion:
    """One servable: a loaded backend, its runner per signature, its in-flight request count, and the feature
    ranges seen in training (None: the version has none; serving/runtime/input_range.py)."""

    version: int
    backend: Backend
    runners: dict[str, Runner] = field(default_factory=dict)
    inflight: int = 0
    retired: bool = False
    ranges: FeatureRanges | None = None
    closed: bool = False  # unloaded: nothing may count anything under its version any more

    async def run(self, request: DecodedRequest, watched: bool = True, span: Any = None) -> np.ndarray:
        """The request's batch -> its (N, K) scores, on the runner of the signature it calls (`watched`:
        Runner.run)."""
        runner = self.runners.get(request.signature)
        if runner is None and self.closed:  # unreachable: a version unloads after its last request
            raise Unavailable(f"version {self.version} was unloaded; retry")
        if runner is None:  # the codecs refuse a signature the version lacks; this is the last guard
            raise InvalidArgument(f'Serving signature name: "{request.signature}" not found in signature def')
        return await runner.run(request.batch, watched, span)

    def close(self) -> None:
        """Stop every runner (the version is unloaded; its queues are empty by then), let go of them, and free
        what the backend's runtime frees only when told to."""
        for runner in self.runners.values():
            runner.close()
        self.runners, self.closed = {}, True
        close_backend(self.backend)
