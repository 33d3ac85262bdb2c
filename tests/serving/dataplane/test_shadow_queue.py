"""The shadow queue under load (serving/dataplane/shadow.py): a full queue and a busy model drop shadow work,
counted, while every client gets the stable version's answer. The real ModelManager, Predictor and ONNX Runtime
versions in one event loop, so the queue's fill is exact.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ctr_contract.repository import ONNX_MODEL, RAW_ONNX_MODEL
from ctr_contract.traffic import TrafficSplit
from serving.codecs.raw_codec import decode_rest
from serving.dataplane.predictor import Predictor
from serving.dataplane.shadow import BUSY_INFLIGHT, QUEUE_JOBS
from serving.dataplane.validation import Limits
from serving.observability.metrics import SHADOW_DROP_REASONS, ServingMetrics
from serving.observability.request_log import RequestLog
from serving.repository.manager import ModelManager
from serving.repository.policy import VersionPolicy
from serving.requests import DecodedRequest
from serving.routing.router import Router
from serving.runtime.servable import BatchingOptions, build_runners
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature
from tests.serving.dataplane.test_unit_predictor import write_raw_onnx
from tests.serving.model_repo import (
    WIDTH,
    make_weights,
    reference_predict,
    write_manifest,
    write_onnx,
    write_version,
)

WEIGHTS = {1: make_weights(seed=1), 2: make_weights(seed=2)}
X = np.random.default_rng(3).random((2, WIDTH)).astype(np.float32)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("repo") / "ctr"
    for version, weights in WEIGHTS.items():
        write_version(base, version, weights)
    return base


@pytest.fixture(scope="module")
def raw_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Versions 1 and 2 serving `raw` too: model_raw.onnx is ctr = sigmoid(I1) in both."""
    base = tmp_path_factory.mktemp("raw") / "ctr"
    for version, weights in WEIGHTS.items():
        folder = base / str(version)
        folder.mkdir(parents=True)
        write_onnx(weights, folder / ONNX_MODEL)
        write_raw_onnx(folder / RAW_ONNX_MODEL)
        write_manifest(folder, version)
    return base


def run(
    base: Path,
    test: Callable[[Predictor], Awaitable[None]],
    batching: BatchingOptions | None,
    logs: Path | None = None,
) -> None:
    """Versions 1 (stable) and 2 (shadow, 100% of the unlabelled requests) behind one Predictor; `logs`: its
    request log's folder (every request logged; None: no request log)."""

    async def main() -> None:
        metrics = ServingMetrics()
        metrics.start_at_zero("ctr")
        with ThreadPoolExecutor(1) as disk, ThreadPoolExecutor(1) as inference:
            router = Router("ctr", {"stable": 1, "shadow": 2}, metrics, TrafficSplit(shadow_percent=100))
            manager = ModelManager(
                "ctr",
                base,
                "onnx",
                1,
                VersionPolicy("all"),
                metrics,
                disk,
                router,
                make_runners=lambda backend, version: build_runners(
                    backend, batching, inference, metrics, "ctr", version
                ),
            )
            await manager.poll_once()
            assert sorted(manager.loaded) == [1, 2]
            request_log = None
            if logs is not None:
                request_log = RequestLog(logs, 1.0, 1 << 20, on_drop=lambda n: None)
                request_log.start()
            limits = Limits(max_instances=64, allow_nonfinite=False)
            predictor = Predictor(manager, router, limits, metrics, request_log=request_log)
            try:
                await test(predictor)
            finally:
                predictor.shadow.stop()
                for servable in manager.loaded.values():
                    servable.close()

    asyncio.run(main())


async def decode(sig: Signature) -> DecodedRequest:
    return DecodedRequest(DEFAULT_SIGNATURE, X)


def dropped(p: Predictor) -> dict[str, float]:
    return {reason: p.metrics.shadow_dropped.values[("ctr", reason)] for reason in SHADOW_DROP_REASONS}


async def settle(p: Predictor) -> None:
    """Let the shadow worker empty its queue."""
    for _ in range(500):
        if p.shadow.queued == 0:
            break
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.01)


def test_a_full_queue_drops_shadow_work_and_counts_it_while_clients_get_stable(base: Path) -> None:
    n = QUEUE_JOBS + 9

    async def test(p: Predictor) -> None:
        # Direct runners score a few rows on the loop without yielding: the worker gets no turn until all n
        # predicts have answered, so exactly QUEUE_JOBS jobs fit and the rest are dropped.
        for i in range(n):
            prediction = await p.predict("ctr", None, None, decode, "REST", f"full-{i}")
            assert prediction.servable.version == 1
            np.testing.assert_allclose(prediction.scores, reference_predict(WEIGHTS[1], X), rtol=1e-5)
        assert p.shadow.queued == QUEUE_JOBS
        await settle(p)
        assert p.metrics.shadow_scored.values == {("ctr", "2"): float(QUEUE_JOBS)}
        assert dropped(p) == {**dict.fromkeys(SHADOW_DROP_REASONS, 0.0), "queue_full": 9.0}
        # The queue has room again: the next one is scored.
        await p.predict("ctr", None, None, decode, "REST", "after")
        await settle(p)
        assert p.metrics.shadow_scored.values == {("ctr", "2"): float(QUEUE_JOBS + 1)}

    run(base, test, None)


def test_a_busy_model_drops_shadow_work_first(base: Path) -> None:
    # A 0.5 s batching window holds the client requests in flight while the shadow jobs come up.
    batching = BatchingOptions(max_batch_size=64, batch_timeout_s=0.5, max_enqueued_batches=8, timeout_s=5.0)
    held = BUSY_INFLIGHT + 4

    async def test(p: Predictor) -> None:
        clients = [
            asyncio.create_task(p.predict("ctr", 1, None, decode, "REST", f"held-{i}")) for i in range(held)
        ]
        await asyncio.sleep(0.05)
        assert p.inflight == held
        for i in range(5):
            p.shadow.offer(DecodedRequest(DEFAULT_SIGNATURE, X), f"busy-{i}")
        await asyncio.sleep(0.05)
        assert p.shadow.queued == 0
        assert dropped(p)["busy"] == 5
        assert p.metrics.shadow_scored.values == {("ctr", "2"): 0.0}  # created at 0, nothing scored
        for prediction in await asyncio.gather(*clients):
            np.testing.assert_allclose(prediction.scores, reference_predict(WEIGHTS[1], X), rtol=1e-5)
        # Idle again: shadow work runs.
        p.shadow.offer(DecodedRequest(DEFAULT_SIGNATURE, X), "idle")
        for _ in range(200):
            if p.metrics.shadow_scored.values[("ctr", "2")] == 1:
                break
            await asyncio.sleep(0.01)
        assert p.metrics.shadow_scored.values == {("ctr", "2"): 1.0}

    run(base, test, batching)


def test_a_shadow_label_without_a_loaded_version_is_skipped_and_counted(base: Path) -> None:
    async def test(p: Predictor) -> None:
        p.router.configure(
            {"stable": 1, "shadow": 7}, p.router.traffic
        )  # version 7 is not loaded (not on disk)
        for i in range(4):
            prediction = await p.predict("ctr", None, None, decode, "REST", f"gone-{i}")
            assert prediction.servable.version == 1
        await settle(p)
        assert dropped(p)["unavailable"] == 4
        assert p.metrics.shadow_scored.values == {}

    run(base, test, None)


def test_raw_requests_queued_together_are_scored_in_one_call_and_logged_each_as_its_own(
    raw_base: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "requests"

    async def test(p: Predictor) -> None:
        counts = {f"raw-{i}": [float(i), float(-i)] for i in range(6)}
        for request_id, values in counts.items():

            async def decode(sig: Signature, values: list[float] = values) -> DecodedRequest:
                return DecodedRequest(RAW_SIGNATURE, decode_rest([{"I1": v} for v in values], False))

            prediction = await p.predict("ctr", None, None, decode, "REST", request_id)
            assert prediction.servable.version == 1
        assert p.shadow.queued == len(counts)
        await settle(p)
        assert p.metrics.shadow_scored.values == {("ctr", "2"): float(len(counts))}
        # One model call a client request, and one for the six shadow jobs together.
        calls = sum(sum(buckets) for buckets, _ in p.metrics.runtime_latency.series.values())
        assert calls == len(counts) + 1
        assert p.request_log is not None
        p.request_log.stop()
        lines = [json.loads(line) for f in logs.glob("*.jsonl") for line in f.read_text().splitlines()]
        shadows = {line["request_id"]: line for line in lines if line["shadow"]}
        assert sorted(shadows) == sorted(counts)
        for request_id, values in counts.items():
            expected = 1 / (1 + np.exp(-np.array(values)))
            np.testing.assert_allclose(np.ravel(shadows[request_id]["outputs"]), expected, rtol=1e-5)
            assert shadows[request_id]["model"]["version"] == 2

    run(raw_base, test, None, logs)


def test_more_rows_than_run_inline_go_through_the_shadow_versions_runner(base: Path, tmp_path: Path) -> None:
    rows = np.random.default_rng(5).random((3, 10, WIDTH)).astype(np.float32)  # 3 requests, 30 rows together
    logs = tmp_path / "requests"

    async def test(p: Predictor) -> None:
        for i, x in enumerate(rows):

            async def decode(sig: Signature, x: np.ndarray = x) -> DecodedRequest:
                return DecodedRequest(DEFAULT_SIGNATURE, x)

            await p.predict("ctr", None, None, decode, "REST", f"big-{i}")
        for _ in range(500):  # the 30 rows run on the inference thread
            if p.metrics.shadow_scored.values.get(("ctr", "2")) == 3:
                break
            await asyncio.sleep(0.01)
        assert p.metrics.shadow_scored.values == {("ctr", "2"): 3.0}
        assert p.request_log is not None
        p.request_log.stop()
        lines = [json.loads(line) for f in logs.glob("*.jsonl") for line in f.read_text().splitlines()]
        shadows = {line["request_id"]: line["outputs"] for line in lines if line["shadow"]}
        for i, x in enumerate(rows):
            np.testing.assert_allclose(shadows[f"big-{i}"], reference_predict(WEIGHTS[2], x), rtol=1e-5)

    run(base, test, None, logs)


def test_a_shadow_version_scoring_nan_is_counted_and_never_logged(tmp_path: Path) -> None:
    base = tmp_path / "ctr"
    write_version(base, 1, WEIGHTS[1])
    broken = [w.copy() for w in WEIGHTS[2]]
    broken[0][0, :] = (
        1e30  # feature 0 of 1e30 overflows float32 to inf, then inf - inf: NaN (warm-up rows are < 1)
    )
    write_version(base, 2, broken)
    logs = tmp_path / "requests"
    x = X.copy()
    x[:, 0] = 1e30

    async def decode(sig: Signature) -> DecodedRequest:
        return DecodedRequest(DEFAULT_SIGNATURE, x)

    async def test(p: Predictor) -> None:
        for i in range(5):
            prediction = await p.predict("ctr", None, None, decode, "REST", f"nan-{i}")
            np.testing.assert_allclose(prediction.scores, reference_predict(WEIGHTS[1], x), rtol=1e-5)
        await settle(p)
        assert dropped(p)["non_finite"] == 5
        assert p.metrics.shadow_scored.values == {("ctr", "2"): 0.0}
        assert p.request_log is not None
        p.request_log.stop()
        lines = [json.loads(line) for f in logs.glob("*.jsonl") for line in f.read_text().splitlines()]
        assert len(lines) == 5 and not any(line["shadow"] for line in lines)

    run(base, test, None, logs)
