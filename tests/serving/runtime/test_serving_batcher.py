"""DynamicBatcher on its own: how requests merge into model calls, the queue bound, deadlines and failures.

The model is a plain function that records each call, so every assertion is about exact batches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pytest

from serving.errors import DeadlineExceeded, Overloaded, ServingError
from serving.observability.metrics import ServingMetrics
from serving.runtime.batcher import DynamicBatcher


class RecordingModel:
    """scores = row sum, one column; remembers the rows of every call."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.fail = fail

    def __call__(self, features: np.ndarray) -> np.ndarray:
        self.calls.append(len(features))
        if self.fail:
            raise RuntimeError("boom")
        return features.sum(axis=1, keepdims=True)


def rows(n: int, start: int) -> np.ndarray:
    """(n, 2) float32 rows whose sums are start, start+1, ... (so each request's answer is recognisable)."""
    first = np.arange(start, start + n, dtype=np.float32)
    return np.stack([first, np.zeros(n, np.float32)], axis=1)


T = TypeVar("T")


def run_batcher(test: Callable[[DynamicBatcher], Awaitable[T]], model: RecordingModel, **options: float) -> T:
    settings = {"max_batch_size": 8, "batch_timeout_s": 0.0, "max_enqueued_batches": 4, "timeout_s": 30.0}
    settings.update(options)

    async def main() -> T:
        with ThreadPoolExecutor(1) as executor:
            batcher = DynamicBatcher(
                model,
                max_batch_size=int(settings["max_batch_size"]),
                batch_timeout_s=settings["batch_timeout_s"],
                max_enqueued_batches=int(settings["max_enqueued_batches"]),
                timeout_s=settings["timeout_s"],
                executor=executor,
                metrics=ServingMetrics(),
                model_name="ctr",
                runtime="test",
            )
            try:
                return await test(batcher)
            finally:
                batcher.close()

    return asyncio.run(main())


def test_requests_queued_together_run_as_one_call_and_get_their_own_rows() -> None:
    model = RecordingModel()

    async def test(b: DynamicBatcher) -> list[list[float]]:
        futures = [b.submit(rows(2, 0)), b.submit(rows(3, 10)), b.submit(rows(3, 20))]
        return [f.ravel().tolist() for f in await asyncio.gather(*futures)]

    assert run_batcher(test, model) == [[0, 1], [10, 11, 12], [20, 21, 22]]
    assert model.calls == [8]


def test_batches_close_at_max_batch_size_and_a_larger_request_runs_alone() -> None:
    model = RecordingModel()

    async def test(b: DynamicBatcher) -> None:
        await asyncio.gather(*(b.submit(rows(3, 0)) for _ in range(5)), b.submit(rows(10, 0)))

    run_batcher(test, model, max_batch_size=8, max_enqueued_batches=4)
    assert model.calls == [6, 6, 3, 10]  # 3+3 (a third would be 9 > 8), 3+3, 3, then the 10-row request


def test_batch_timeout_holds_a_partial_batch_open_but_not_a_full_one() -> None:
    model = RecordingModel()

    async def test(b: DynamicBatcher) -> tuple[float, float]:
        t0 = time.perf_counter()
        await b.submit(rows(4, 0))  # full: runs at once
        full = time.perf_counter() - t0
        t0 = time.perf_counter()
        await b.submit(rows(1, 0))  # waits up to the batch timeout for company
        return full, time.perf_counter() - t0

    full, partial = run_batcher(test, model, max_batch_size=4, batch_timeout_s=1.0)
    assert full < 1.0 <= partial
    assert model.calls == [4, 1]


def test_a_full_queue_refuses_at_once() -> None:
    model = RecordingModel()

    async def test(b: DynamicBatcher) -> None:
        first = b.submit(rows(4, 0))
        with pytest.raises(Overloaded) as caught:
            b.submit(rows(1, 0))
        assert str(caught.value) == "batching queue is full (4 rows queued, limit 4); retry later"
        await first

    run_batcher(test, model, max_batch_size=4, max_enqueued_batches=1)
    assert model.calls == [4]


def test_a_request_past_its_deadline_is_not_run() -> None:
    model = RecordingModel()

    async def test(b: DynamicBatcher) -> None:
        with pytest.raises(DeadlineExceeded, match=r"in the batching queue, over the 0 ms deadline"):
            await b.submit(rows(1, 0))

    run_batcher(test, model, timeout_s=0.0)
    assert model.calls == []


def test_a_failed_model_call_fails_every_request_of_the_batch() -> None:
    model = RecordingModel(fail=True)

    async def test(b: DynamicBatcher) -> list[str]:
        results = await asyncio.gather(b.submit(rows(1, 0)), b.submit(rows(2, 0)), return_exceptions=True)
        assert all(isinstance(r, ServingError) for r in results)
        return [str(r) for r in results]

    assert run_batcher(test, model) == ["model execution failed: boom"] * 2
    assert model.calls == [3]


def watched_batcher(metrics: ServingMetrics) -> Callable[[RecordingModel], DynamicBatcher]:
    """A batcher whose BatchWatch counts into `metrics` (statistics of version 1, the histogram; no drift)."""
    from serving.runtime.batcher import BatchWatch
    from serving.signatures import DEFAULT_SIGNATURE, Signature

    signature = Signature("features", "ctr", 2, 1)
    watch = BatchWatch("ctr", 1, signature, DEFAULT_SIGNATURE, metrics, None, metrics.model_stats)

    def make(model: RecordingModel) -> DynamicBatcher:
        return DynamicBatcher(
            model,
            max_batch_size=8,
            batch_timeout_s=0.0,
            max_enqueued_batches=4,
            timeout_s=30.0,
            executor=None,
            metrics=metrics,
            model_name="ctr",
            runtime="test",
            watch=watch,
        )

    return make


def run_watched(make: Callable[[RecordingModel], DynamicBatcher], model: RecordingModel) -> list[list[float]]:
    async def main() -> list[list[float]]:
        batcher = make(model)
        try:
            futures = [batcher.submit(rows(2, 0)), batcher.submit(rows(3, 10)), batcher.submit(rows(1, 20))]
            return [f.ravel().tolist() for f in await asyncio.gather(*futures)]
        finally:
            batcher.close()

    return asyncio.run(main())


def test_a_batch_is_watched_once_its_rows_counted_as_one_execution() -> None:
    metrics = ServingMetrics()
    model = RecordingModel()
    assert run_watched(watched_batcher(metrics), model) == [[0, 1], [10, 11, 12], [20]]
    assert model.calls == [6]
    row = metrics.model_stats.row("ctr", 1, "serving_default")
    assert (row.execution_count, row.inference_count) == (1, 6)  # one model call of the three requests' rows
    assert row.compute_infer_ns > 0 and row.queue_ns >= 0 and row.last_inference > 0
    counts, total = metrics.predicted_ctr.series[("ctr",)]
    assert (sum(counts), total[0]) == (6, 0 + 1 + 10 + 11 + 12 + 20)  # every row's score, once


def test_a_watch_that_fails_is_logged_once_and_the_requests_keep_their_scores(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = ServingMetrics()

    def broken(*args: object) -> None:
        raise RuntimeError("a broken statistics row")

    monkeypatch.setattr(metrics.model_stats, "executed", broken)
    make = watched_batcher(metrics)
    for _ in range(2):  # the second batch finds the watch off: nothing raised, nothing logged again
        assert run_watched(make, RecordingModel()) == [[0, 1], [10, 11, 12], [20]]
    failures = [r for r in caplog.records if "are off from now on" in r.getMessage()]
    assert len(failures) == 1 and "ctr version 1" in failures[0].getMessage()
    assert ("ctr",) not in metrics.predicted_ctr.series  # nothing counted once the watch failed


def test_a_shadow_request_among_a_batch_is_executed_but_not_watched() -> None:
    metrics = ServingMetrics()
    make = watched_batcher(metrics)

    async def main() -> list[list[float]]:
        batcher = make(RecordingModel())
        try:
            answers = [
                batcher.run(rows(2, 0)),
                batcher.run(rows(3, 10), watched=False),  # a shadow version's rows
                batcher.run(rows(1, 20)),
            ]
            return [a.ravel().tolist() for a in await asyncio.gather(*answers)]
        finally:
            batcher.close()

    assert asyncio.run(main()) == [[0, 1], [10, 11, 12], [20]]
    row = metrics.model_stats.row("ctr", 1, "serving_default")
    assert (row.execution_count, row.inference_count) == (1, 6)  # one model call, every row it ran
    counts, total = metrics.predicted_ctr.series[("ctr",)]
    assert (sum(counts), total[0]) == (3, 0 + 1 + 20)  # the answers' scores alone
