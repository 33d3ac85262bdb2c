"""serving/dataplane/predictor.py without a server: a real ONNX Runtime version behind the one predict path.

The version folder holds the MLP of tests/serving/model_repo.py (model.onnx) and a tiny raw graph
(model_raw.onnx: ctr = sigmoid(I1), a missing I1 counting as 0), both run by ONNX Runtime itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ctr_contract.repository import ONNX_MODEL, RAW_ONNX_MODEL
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from serving.codecs.raw_codec import decode_rest
from serving.dataplane.model_set import ServedModels
from serving.dataplane.predictor import Predictor
from serving.dataplane.validation import Limits
from serving.errors import InvalidArgument, NotFound, ServingError, Unavailable, Unimplemented
from serving.observability.drift import DriftMonitor
from serving.observability.metrics import ServingMetrics
from serving.protocols.v2_models import V2Models
from serving.repository.manager import ModelManager
from serving.repository.policy import VersionPolicy
from serving.requests import DecodedRequest
from serving.routing.router import Router
from serving.runtime.batcher import DynamicBatcher
from serving.runtime.servable import BatchingOptions, DirectRunner, build_runners
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature
from tests.serving.model_repo import (
    WIDTH,
    make_weights,
    reference_outputs,
    reference_predict,
    write_manifest,
    write_onnx,
    write_version,
)

T = TypeVar("T")
WEIGHTS = make_weights(seed=1)


def write_raw_onnx(path: Path) -> None:
    """The raw signature's 39 inputs -> ctr [N, 1] = sigmoid(I1), NaN (missing) as 0; the other fields unused."""
    inputs = [helper.make_tensor_value_info(f, TensorProto.DOUBLE, ["batch"]) for f in NUMERIC_FIELDS]
    inputs += [helper.make_tensor_value_info(f, TensorProto.STRING, ["batch"]) for f in CATEGORICAL_FIELDS]
    nodes = [
        helper.make_node("IsNaN", ["I1"], ["missing"]),
        helper.make_node(
            "Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.DOUBLE, [], [0.0])
        ),
        helper.make_node("Where", ["missing", "zero", "I1"], ["count"]),
        helper.make_node("Cast", ["count"], ["count32"], to=TensorProto.FLOAT),
        helper.make_node(
            "Constant", [], ["axis"], value=helper.make_tensor("axis", TensorProto.INT64, [1], [1])
        ),
        helper.make_node("Unsqueeze", ["count32", "axis"], ["column"]),
        helper.make_node("Sigmoid", ["column"], ["ctr"]),
    ]
    output = helper.make_tensor_value_info("ctr", TensorProto.FLOAT, ["batch", 1])
    model = helper.make_model(
        helper.make_graph(nodes, "raw", inputs, [output]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`<base>/1/` with model.onnx, model_raw.onnx and a manifest (no warm-up file: one zero row warms it)."""
    base = tmp_path_factory.mktemp("repo") / "ctr"
    version = base / "1"
    version.mkdir(parents=True)
    write_onnx(WEIGHTS, version / ONNX_MODEL)
    write_raw_onnx(version / RAW_ONNX_MODEL)
    write_manifest(version, 1)
    return base


def run_with_predictor(
    base: Path,
    test: Callable[[Predictor], Awaitable[T]],
    batching: BatchingOptions | None = None,
    drift: DriftMonitor | None = None,
    statistics: bool = True,
) -> T:
    """Load `base` into a ModelManager (ONNX Runtime backend) and run `test` against a Predictor over it;
    `drift`: what watches its answers; `statistics`: Triton's statistics kept (`--model_statistics`)."""

    async def main() -> T:
        metrics = ServingMetrics()
        with ThreadPoolExecutor(1) as disk, ThreadPoolExecutor(1) as inference:
            router = Router("ctr", {"stable": 1}, metrics)
            manager = ModelManager(
                "ctr",
                base,
                "onnx",
                1,
                VersionPolicy("latest"),
                metrics,
                disk,
                router,
                make_runners=lambda backend, version: build_runners(
                    backend, batching, inference, metrics, "ctr", version, drift, statistics
                ),
            )
            await manager.poll_once()
            limits = Limits(max_instances=64, allow_nonfinite=False)
            predictor = Predictor(manager, router, limits, metrics, drift, statistics=statistics)
            try:
                return await test(predictor)
            finally:
                for servable in manager.loaded.values():
                    servable.close()

    return asyncio.run(main())


def features_of(batch: np.ndarray) -> Callable[[Signature], Awaitable[DecodedRequest]]:
    async def decode(sig: Signature) -> DecodedRequest:
        return DecodedRequest(DEFAULT_SIGNATURE, batch)

    return decode


def raw_of(rows: list[dict[str, object]]) -> Callable[[Signature], Awaitable[DecodedRequest]]:
    async def decode(sig: Signature) -> DecodedRequest:
        return DecodedRequest(RAW_SIGNATURE, decode_rest(rows, False))

    return decode


def test_features_run_on_the_resolved_version_and_match_the_numpy_forward_pass(base: Path) -> None:
    x = np.random.default_rng(0).random((3, WIDTH), np.float32)

    async def test(p: Predictor) -> None:
        prediction = await p.predict("ctr", None, None, features_of(x), "REST")
        assert prediction.servable.version == 1 and prediction.request.signature == DEFAULT_SIGNATURE
        np.testing.assert_allclose(prediction.scores, reference_predict(WEIGHTS, x), rtol=1e-5, atol=1e-6)
        assert p.metrics.request_count.values == {("ctr", "OK"): 1.0}
        assert (p.inflight, prediction.servable.inflight) == (0, 0)

    run_with_predictor(base, test)


def test_raw_rows_run_the_raw_graph_through_the_same_path(base: Path) -> None:
    async def test(p: Predictor) -> None:
        prediction = await p.predict("ctr", 1, None, raw_of([{"I1": 2}, {}, {"I1": -1, "C1": "x"}]), "GRPC")
        assert prediction.request.signature == RAW_SIGNATURE
        expected = 1 / (1 + np.exp(-np.array([[2.0], [0.0], [-1.0]])))
        np.testing.assert_allclose(prediction.scores, expected, rtol=1e-6)

    run_with_predictor(base, test)


def test_decode_gets_the_signature_of_the_version_the_label_names(base: Path) -> None:
    seen: list[Signature] = []

    async def decode(sig: Signature) -> DecodedRequest:
        seen.append(sig)
        return DecodedRequest(DEFAULT_SIGNATURE, np.zeros((1, WIDTH), np.float32))

    async def test(p: Predictor) -> None:
        prediction = await p.predict("ctr", None, "stable", decode, "REST")
        assert prediction.servable.version == 1

    run_with_predictor(base, test)
    assert seen == [Signature("features", "ctr", WIDTH, 1, has_raw=True)]


@pytest.mark.parametrize(
    ("name", "version", "label", "error", "status"),
    [
        ("nope", None, None, NotFound("Servable not found for request: Latest(nope)"), "NOT_FOUND"),
        ("ctr", 7, None, NotFound("Servable not found for request: Specific(ctr, 7)"), "NOT_FOUND"),
        (
            "ctr",
            None,
            "canary",
            InvalidArgument("Unrecognized servable version label: canary"),
            "INVALID_ARGUMENT",
        ),
    ],
    ids=["unknown-model", "unknown-version", "unknown-label"],
)
def test_an_unresolvable_model_spec_fails_before_decoding_and_is_counted(
    base: Path, name: str, version: int | None, label: str | None, error: ServingError, status: str
) -> None:
    async def decode(sig: Signature) -> DecodedRequest:
        raise AssertionError("decoded although the version did not resolve")

    async def test(p: Predictor) -> None:
        with pytest.raises(type(error)) as caught:
            await p.predict(name, version, label, decode, "REST")
        assert caught.value.message == error.message
        model = "ctr" if name == "ctr" else "unknown"
        assert p.metrics.request_count.values == {(model, status): 1.0}

    run_with_predictor(base, test)


def test_a_bad_batch_is_refused_by_validation_and_releases_the_version(base: Path) -> None:
    async def test(p: Predictor) -> None:
        with pytest.raises(InvalidArgument) as caught:
            await p.predict("ctr", None, None, features_of(np.zeros((0, WIDTH), np.float32)), "REST")
        assert caught.value.message == "empty batch: no instances for input 'features'; send at least one"
        assert p.metrics.request_count.values == {("ctr", "INVALID_ARGUMENT"): 1.0}
        assert (p.inflight, p.manager.loaded[1].inflight) == (0, 0)

    run_with_predictor(base, test)


def test_a_draining_predictor_refuses_new_requests(base: Path) -> None:
    async def test(p: Predictor) -> None:
        assert await p.drain(0.0)
        with pytest.raises(Unavailable) as caught:
            await p.predict("ctr", None, None, features_of(np.zeros((1, WIDTH), np.float32)), "GRPC")
        assert caught.value.message == "the server is shutting down; retry on another replica"
        assert p.metrics.request_count.values == {("ctr", "UNAVAILABLE"): 1.0}

    run_with_predictor(base, test)


def test_each_signature_has_its_own_batcher_and_concurrent_requests_get_their_own_rows(base: Path) -> None:
    batching = BatchingOptions(
        max_batch_size=64, batch_timeout_s=0.05, max_enqueued_batches=4, timeout_s=30.0
    )
    x = np.random.default_rng(1).random((5, WIDTH), np.float32)

    async def test(p: Predictor) -> None:
        runners = p.manager.loaded[1].runners
        assert sorted(runners) == [RAW_SIGNATURE, DEFAULT_SIGNATURE]
        assert all(isinstance(r, DynamicBatcher) for r in runners.values())
        results = await asyncio.gather(
            p.predict("ctr", None, None, features_of(x[:2]), "REST"),
            p.predict("ctr", None, None, raw_of([{"I1": 3}]), "REST"),
            p.predict("ctr", None, None, features_of(x[2:]), "REST"),
        )
        np.testing.assert_allclose(
            np.concatenate([results[0].scores, results[2].scores]),
            reference_predict(WEIGHTS, x),
            rtol=1e-5,
            atol=1e-6,
        )
        np.testing.assert_allclose(results[1].scores, [[1 / (1 + np.exp(-3.0))]], rtol=1e-6)
        # The two feature requests waited in one queue and ran as one call of 5 rows; the raw row ran apart.
        counts, total = p.metrics.batch_size.series[("ctr",)]
        assert (sum(counts), total[0]) == (2, 5.0 + 1.0)

    run_with_predictor(base, test, batching)


def test_without_batching_every_signature_runs_directly(base: Path) -> None:
    async def test(p: Predictor) -> None:
        assert all(isinstance(r, DirectRunner) for r in p.manager.loaded[1].runners.values())

    run_with_predictor(base, test)


class _DriftRecorder:
    """Stands in for the drift monitor: keeps the scores each model call hands it."""

    def __init__(self) -> None:
        self.scores: list[np.ndarray] = []

    def observe_batch(self, signature: str, batch: Any, scores: np.ndarray) -> None:
        self.scores.append(scores)


def test_a_two_output_version_answers_both_and_drift_watches_ctr_alone(tmp_path: Path) -> None:
    base = tmp_path / "ctr"
    write_version(base, 1, WEIGHTS, calibrated=True)
    rows = [np.random.default_rng(i).random((n, WIDTH), np.float32) for i, n in enumerate((1, 3, 2))]
    drift = _DriftRecorder()
    batching = BatchingOptions(max_batch_size=64, batch_timeout_s=0.05, max_enqueued_batches=4, timeout_s=5)

    async def test(p: Predictor) -> None:
        answers = await asyncio.gather(*(p.predict("ctr", None, None, features_of(x), "REST") for x in rows))
        assert p.manager.loaded[1].backend.signature.output_names == ("ctr", "raw_score")
        for x, answer in zip(rows, answers, strict=True):
            expected = reference_outputs(WEIGHTS, x)
            assert answer.scores.shape == (len(x), 2)  # one batch of 6 rows, split back per request
            np.testing.assert_allclose(answer.scores[:, :1], expected["ctr"], atol=1e-6)
            np.testing.assert_allclose(answer.scores[:, 1:], expected["raw_score"], atol=1e-6)
        counts, total = p.metrics.batch_size.series[("ctr",)]
        assert (sum(counts), total) == (1, [6.0])  # one model call of the three requests' 6 rows

    run_with_predictor(base, test, batching, drift)  # type: ignore[arg-type]
    # Drift is told of the model call (serving/runtime/batcher.py): its 6 rows' `ctr` column alone.
    assert [s.shape for s in drift.scores] == [(6, 1)]
    expected = reference_outputs(WEIGHTS, np.concatenate(rows))["ctr"]
    np.testing.assert_allclose(drift.scores[0], expected, atol=1e-6)


@pytest.mark.parametrize("statistics", [True, False])
def test_statistics_are_kept_only_when_on_and_a_v2_statistics_call_says_they_are_off(
    base: Path, statistics: bool
) -> None:
    batch = np.random.default_rng(3).random((2, WIDTH), dtype=np.float32)
    options = BatchingOptions(max_batch_size=8, batch_timeout_s=0.0, max_enqueued_batches=4, timeout_s=5.0)

    async def test(p: Predictor) -> None:
        for _ in range(3):
            await p.predict("ctr", None, None, features_of(batch), "REST")
        v2 = V2Models(ServedModels.one(p).current)
        if statistics:
            assert p.metrics.statistics()[("ctr", "1")]["inference_count"] == 6
            assert p.metrics.statistics()[("ctr", "1")]["success"] == 3
            assert v2.statistics("ctr", None)["model_stats"][0]["inference_count"] == 6
            assert "statistics" in v2.server_metadata()["extensions"]
        else:
            assert "statistics" not in v2.server_metadata()["extensions"]
            assert p.metrics.statistics() == {}
            with pytest.raises(Unimplemented, match="--model_statistics=false"):
                v2.statistics("ctr", None)

    run_with_predictor(base, test, options, statistics=statistics)
