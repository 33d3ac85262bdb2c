"""OpenTelemetry tracing against a real OTLP receiver (OTLP's TraceService on gRPC, tests/serving/otlp_receiver.py).

The span tree of one raw REST request and of one gRPC request (names, parents, attributes, the batch span's
links), W3C traceparent in and out, a malformed traceparent, parent-based sampling, the OTEL_* variables
without a file, and a dead collector (predictions unaffected, drops counted, one warning).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from serving import protos
from serving.codecs.tensors import from_ndarray
from serving.observability.tracing import read_config, wanted
from tests.helpers import free_port
from tests.serving.otlp_receiver import OtlpReceiver
from tests.serving.raw_model_repo import fit_spec, seen_values, write_raw_version
from tests.serving.server_process import ServerProcess, http

TRACEPARENT = re.compile(
    r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$"
)  # flags: 01 sampled, 02 random ids
CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def raw_base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    spec = fit_spec()
    base = tmp_path_factory.mktemp("traced") / "ctr"
    write_raw_version(base, 1, spec)
    return base, seen_values(spec)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.stop()


def _config(path: Path, **settings: Any) -> Path:
    path.write_text(
        json.dumps({"protocol": "grpc", "sample_ratio": 1.0, "schedule_delay_ms": 50, **settings})
    )
    return path


@pytest.fixture(scope="module")
def traced(tmp_path_factory, raw_base, receiver: OtlpReceiver) -> Iterator[ServerProcess]:
    """A batching server exporting every span to the receiver (a 20 ms window, so concurrent requests share)."""
    logs = tmp_path_factory.mktemp("traced_logs")
    config = _config(logs / "tracing.json", endpoint=receiver.endpoint)
    server = ServerProcess(
        raw_base[0],
        logs / "server.log",
        "--enable_batching",
        "--batch_timeout_micros=20000",
        f"--tracing_config={config}",
    )
    server.wait_ready()
    yield server
    server.stop()


def _raw_predict(server: ServerProcess, rows: list[dict], traceparent: str | None) -> tuple[int, dict, str]:
    """POST raw rows; (status, body, the traceparent answered)."""
    body = json.dumps({"signature_name": "raw", "instances": rows}).encode()
    request = urllib.request.Request(server.url("/v1/models/ctr:predict"), data=body, method="POST")
    if traceparent is not None:
        request.add_header("traceparent", traceparent)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read()), response.headers.get("traceparent", "")


def _tree(spans: list[dict]) -> dict[str, list[str]]:
    """span name -> its children's names (sorted)."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str, list[str]] = {s["name"]: [] for s in spans}
    for s in spans:
        parent = by_id.get(s["parent_span_id"])
        if parent is not None:
            children[parent["name"]].append(s["name"])
    return {k: sorted(v) for k, v in children.items()}


def test_raw_rest_request_is_one_trace_under_the_clients_traceparent(traced, receiver, raw_base) -> None:
    rows = [{"I1": 3, "I2": 7, "C1": raw_base[1][0]}, {"I1": 1, "C1": "unseen"}]
    status, body, answered = _raw_predict(traced, rows, f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
    assert status == 200 and len(body["predictions"]) == 2
    match = TRACEPARENT.match(answered)
    assert match and match.group(1) == CLIENT_TRACE and match.group(2) != CLIENT_SPAN, answered
    assert answered.endswith("-01")
    spans = receiver.wait(lambda: (t := receiver.trace(CLIENT_TRACE)) and len(t) >= 6 and t)
    if os.environ.get("CTR_TRACE_DUMP"):  # the picture in docs/serving.md (tests/serving/trace_picture.py)
        receiver.dump(spans, Path(os.environ["CTR_TRACE_DUMP"]))
    root = next(s for s in spans if s["name"] == "predict")
    assert root["parent_span_id"] == CLIENT_SPAN and root["span_id"] == match.group(2)
    assert root["kind"] == "SERVER" and root["service"] == "ctr-serving"
    assert root["attributes"] == {
        "ctr.entrypoint": "REST",
        "ctr.model.name": "ctr",
        "ctr.model.version": 1,
        "ctr.signature": "raw",
        "ctr.batch_size": 2,
        "ctr.status": "OK",
        "http.response.status_code": 200,
    }
    assert _tree(spans) == {
        "predict": ["batch", "decode", "encode", "queue_wait"],
        "batch": ["model_run", "transform"],
        "decode": [],
        "queue_wait": [],
        "encode": [],
        "transform": [],
        "model_run": [],
    }
    batch = next(s for s in spans if s["name"] == "batch")
    assert (CLIENT_TRACE, root["span_id"]) in batch["links"] and batch["attributes"]["ctr.batch_size"] >= 2
    for s in spans:  # children lie inside their parents
        assert root["start_ns"] <= s["start_ns"] <= s["end_ns"] <= root["end_ns"], s


def test_grpc_request_traceparent_in_metadata_and_back_in_trailers(traced, receiver) -> None:
    trace_id = "a" * 31 + "1"
    request = protos.PredictRequest()
    request.model_spec.name = "ctr"
    from_ndarray(np.zeros((3, 128), np.float32), request.inputs["features"])
    with grpc.insecure_channel(traced.grpc_target) as channel:
        call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        raw, state = call.with_call(
            request.SerializeToString(),
            metadata=(("traceparent", f"00-{trace_id}-{CLIENT_SPAN}-01"),),
            timeout=10,
        )
        trailing = dict(state.trailing_metadata())
    response = protos.PredictResponse.FromString(raw)
    assert response.model_spec.signature_name == "serving_default"
    match = TRACEPARENT.match(trailing["traceparent"])
    assert match and match.group(1) == trace_id
    spans = receiver.wait(lambda: (t := receiver.trace(trace_id)) and len(t) >= 5 and t)
    root = next(s for s in spans if s["name"] == "predict")
    assert root["parent_span_id"] == CLIENT_SPAN and root["span_id"] == match.group(2)
    assert root["attributes"]["ctr.entrypoint"] == "GRPC"
    assert root["attributes"]["ctr.signature"] == "serving_default"
    assert root["attributes"]["ctr.batch_size"] == 3 and root["attributes"]["ctr.status"] == "OK"
    tree = _tree(spans)
    assert tree["predict"] == ["batch", "decode", "encode", "queue_wait"] and tree["batch"] == ["model_run"]


def test_v2_grpc_infer_is_traced_too(traced, receiver) -> None:
    from serving.protos import v2

    trace_id = "f" * 31 + "2"
    request = v2.RPCS["ModelInfer"][0](model_name="ctr", id="traced")
    request.inputs.add(name="features", datatype="FP32", shape=[2, 128])
    request.raw_input_contents.append(np.zeros((2, 128), "<f4").tobytes())
    with grpc.insecure_channel(traced.grpc_target) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        raw, state = call.with_call(
            request.SerializeToString(),
            metadata=(("traceparent", f"00-{trace_id}-{CLIENT_SPAN}-01"),),
            timeout=10,
        )
    assert v2.ModelInferResponse.FromString(raw).id == "traced"
    match = TRACEPARENT.match(dict(state.trailing_metadata())["traceparent"])
    assert match and match.group(1) == trace_id
    spans = receiver.wait(lambda: (t := receiver.trace(trace_id)) and len(t) >= 5 and t)
    root = next(s for s in spans if s["name"] == "infer")
    assert root["parent_span_id"] == CLIENT_SPAN and root["attributes"]["ctr.batch_size"] == 2
    assert _tree(spans)["infer"] == ["batch", "decode", "encode", "queue_wait"]


def test_v2_rest_infer_is_traced_too(traced, receiver) -> None:
    trace_id = "f" * 31 + "3"
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 128], "data": [0.5] * 128}]}
    request = urllib.request.Request(
        traced.url("/v2/models/ctr/infer"), data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("traceparent", f"00-{trace_id}-{CLIENT_SPAN}-01")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200 and response.headers["traceparent"].startswith(f"00-{trace_id}-")
    spans = receiver.wait(lambda: (t := receiver.trace(trace_id)) and len(t) >= 5 and t)
    assert _tree(spans)["infer"] == ["batch", "decode", "encode", "queue_wait"]


def test_a_batch_span_links_every_request_it_carries(traced, receiver, raw_base) -> None:
    parents = [f"00-{i:032x}-{CLIENT_SPAN}-01" for i in range(0xB0, 0xB6)]
    with ThreadPoolExecutor(len(parents)) as pool:
        answers = list(pool.map(lambda tp: _raw_predict(traced, [{"I1": 2}], tp), parents))
    assert all(status == 200 for status, _, _ in answers)
    roots = {tp[3:35]: answered.split("-")[2] for tp, (_, _, answered) in zip(parents, answers, strict=True)}

    def shared_batches() -> list[dict]:
        with receiver.lock:
            batches = [s for s in receiver.spans if s["name"] == "batch" and s["trace_id"] in roots]
        return [b for b in batches if len(b["links"]) >= 2]

    batches = receiver.wait(shared_batches)
    for batch in batches:
        for trace_id, span_id in batch["links"]:
            assert roots[trace_id] == span_id  # each link is a request's own span
        assert batch["attributes"]["ctr.batch_size"] == len(batch["links"])


def test_malformed_traceparent_is_ignored_and_a_new_trace_started(traced, receiver) -> None:
    for bad in (
        "garbage",
        f"00-{'0' * 32}-{CLIENT_SPAN}-01",
        f"zz-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        "00-abc",
    ):
        status, _, answered = _raw_predict(traced, [{"I1": 1}], bad)
        match = TRACEPARENT.match(answered)
        assert status == 200 and match and match.group(1) not in (CLIENT_TRACE, "0" * 32), (bad, answered)
        spans = receiver.wait(lambda m=match: receiver.trace(m.group(1)))
        root = receiver.wait(
            lambda m=match: [s for s in receiver.trace(m.group(1)) if s["name"] == "predict"]
        )[0]
        assert root["parent_span_id"] == "" and spans


def test_an_unsampled_parent_is_followed_and_nothing_recorded(traced, receiver) -> None:
    trace_id = "c" * 32
    status, _, answered = _raw_predict(traced, [{"I1": 1}], f"00-{trace_id}-{CLIENT_SPAN}-00")
    assert status == 200 and answered.startswith(f"00-{trace_id}-") and answered.endswith("-00")
    _raw_predict(traced, [{"I1": 1}], f"00-{'d' * 32}-{CLIENT_SPAN}-01")  # a sampled one after it
    receiver.wait(lambda: receiver.trace("d" * 32))
    assert receiver.trace(trace_id) == []


def test_otel_variables_alone_turn_tracing_on(tmp_path, raw_base, receiver, monkeypatch) -> None:
    for key, value in {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "ctr-canary",
    }.items():
        monkeypatch.setenv(key, value)
    server = ServerProcess(raw_base[0], tmp_path / "server.log")
    try:
        server.wait_ready()
        trace_id = "e" * 32
        status, _, answered = _raw_predict(server, [{"I1": 1}], f"00-{trace_id}-{CLIENT_SPAN}-01")
        assert status == 200 and answered.startswith(f"00-{trace_id}-")
        spans = receiver.wait(lambda: (t := receiver.trace(trace_id)) and len(t) >= 4 and t)
        assert {s["service"] for s in spans} == {"ctr-canary"}
        # No batching: the request's own transform and model run, no queue, no batch span.
        assert _tree(spans)["predict"] == ["decode", "encode", "model_run", "transform"]
    finally:
        server.stop()


@pytest.mark.parametrize("collector", ["down", "slow"])
def test_dead_or_slow_collector_leaves_predictions_unaffected_and_counts_drops(
    tmp_path, raw_base, collector: str
) -> None:
    slow = OtlpReceiver(delay_s=3.0) if collector == "slow" else None  # answers after the 1 s export timeout
    endpoint = slow.endpoint if slow is not None else f"http://127.0.0.1:{free_port()}"  # down: nobody there
    config = _config(tmp_path / "t.json", endpoint=endpoint, max_queue_size=8, export_timeout_s=1)
    server = ServerProcess(
        raw_base[0], tmp_path / "server.log", "--enable_batching", f"--tracing_config={config}"
    )
    try:
        server.wait_ready()
        slowest = 0.0
        for _ in range(60):
            started = time.perf_counter()
            status, body, answered = _raw_predict(server, [{"I1": 4}], None)
            slowest = max(slowest, time.perf_counter() - started)
            assert status == 200 and len(body["predictions"]) == 1 and TRACEPARENT.match(answered)
        assert slowest < 1.0, f"a request took {slowest:.3f}s with the collector down"

        def dropped() -> float:
            _, text = http(server.url("/metrics"))
            found = re.search(r"^ctr_serving_trace_spans_dropped_total (\S+)$", str(text), re.M)
            return float(found.group(1)) if found else 0.0

        deadline = time.monotonic() + 20
        while dropped() < 60 and time.monotonic() < deadline:  # 6 spans a request, a queue of 8
            time.sleep(0.1)
        assert dropped() >= 60
    finally:
        server.stop()
        if slow is not None:
            slow.stop()
    log = server.log()
    assert log.count("spans dropped so far") == 1, log  # once a minute, not once a span
    assert "Queue full" not in log or log.count("Queue full") == 1


def test_tracing_off_imports_no_sdk_and_answers_no_traceparent(raw_base, tmp_path) -> None:
    code = (
        "import sys; import serving.app.server, serving.observability.tracing as t; "
        "t.setup(None); assert not t.ACTIVE; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_which_settings_turn_tracing_on(tmp_path) -> None:
    assert not wanted(None, {})
    assert wanted(None, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"})
    assert not wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"})
    assert not wanted(tmp_path / "t.json", {"OTEL_SDK_DISABLED": "true"})
    assert wanted(tmp_path / "t.json", {})
    bad = tmp_path / "bad.json"
    for text, message in (
        ("{", "bad.json"),
        ('{"ratio": 1}', "keys among"),
        ('{"sample_ratio": 2}', "[0, 1]"),
    ):
        bad.write_text(text)
        with pytest.raises(ValueError, match=re.escape(message)):
            read_config(bad)


def test_the_fast_sampling_decision_is_the_sdks() -> None:
    """Requests are started without the SDK's tracer: the decision must be ParentBased(ratio)'s, and a
    sampled request's parent the one the SDK's propagator reads."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from serving.observability.spans.sdk import request_starter

    finished: list[Any] = []
    current: ContextVar[Any] = ContextVar("span", default=None)
    never = request_starter(0.0, time.time_ns, finished.append, current, "REST")
    span = "00f067aa0ba902b7"
    for header in (
        f"00-{CLIENT_TRACE}-{span}-01",
        f"00-{CLIENT_TRACE}-{span}-00",
        f"00-{CLIENT_TRACE}-{span}-03",
        f"01-{CLIENT_TRACE}-{span}-01-future",
        f"00-{CLIENT_TRACE}-{span}-01-extra",
        f"00-{CLIENT_TRACE.upper()}-{span}-01",
        f"ff-{CLIENT_TRACE}-{span}-01",
        f"00-{'0' * 32}-{span}-01",
        f"00-{CLIENT_TRACE}-{'0' * 16}-01",
        "garbage",
        "",
    ):
        parent = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": header}))
        context = parent.get_span_context()
        started, token, answer = never("predict", header.encode())
        assert (answer[3:35].decode() == CLIENT_TRACE) == context.is_valid, (header, answer)
        if context.is_valid and context.trace_flags.sampled:  # the SDK records it, following its parent
            assert started is not None and started.parent == context, header
            assert started.parent.is_remote and answer.endswith(b"-01"), header
            assert answer[36:52].decode() == f"{started.context.span_id:016x}"
            assert current.get() is started
            current.reset(token)
            started.end()
        elif context.is_valid:  # an unsampled parent: followed, its trace id answered, nothing recorded
            assert started is None and token is None and answer.endswith(b"-00"), header
        else:  # an unsampled root: recorded nowhere, nothing answered
            assert started is None and token is None and answer == b"", header
    assert len(finished) == 3 and all(s.attributes == {"ctr.entrypoint": "REST"} for s in finished)
    quarter = request_starter(0.25, time.time_ns, finished.append, current, "GRPC", b"traceparent: ")
    started_all = [quarter("predict", b"") for _ in range(20_000)]
    sampled = [s for s, _, _ in started_all if s is not None]
    # A sampled root answers its traceparent; an unsampled one nothing (its trace is recorded nowhere).
    assert all(answer.startswith(b"traceparent: 00-") == (s is not None) for s, _, answer in started_all)
    assert all(answer == b"" for s, _, answer in started_all if s is None)
    assert 4_500 < len(sampled) < 5_500  # roots at the ratio
    # The root's trace id is the one the ratio was decided on (TraceIdRatioBased's rule, downstream too).
    assert all(s.context.trace_id & (2**64 - 1) < 2**62 and s.parent is None for s in sampled)


def test_otlp_wire_writes_the_sdks_message() -> None:
    """The gRPC exporter's requests (serving/observability/spans/otlp_wire.py) are `encode_spans`' own."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    from serving.observability.spans.otlp_wire import encode_request

    resource, scope = Resource.create({"service.name": "ctr-serving"}), InstrumentationScope("ctr-serving")
    remote = SpanContext(int(CLIENT_TRACE, 16), int(CLIENT_SPAN, 16), True, TraceFlags(1))
    own = SpanContext(int(CLIENT_TRACE, 16), 0xAB, False, TraceFlags(1))

    def span(name: str, **fields: Any) -> ReadableSpan:
        values = {"context": own, "parent": remote, "start_time": 10**18, "end_time": 10**18 + 5}
        values.update(resource=resource, instrumentation_scope=scope)
        return ReadableSpan(name=name, **{**values, **fields})

    attributes = {"ctr.model.version": 3, "ctr.status": "OK", "big": -(2**40), "r": 0.25, "b": True}
    spans = [
        span("predict", kind=SpanKind.SERVER, attributes=attributes),
        span("encode", parent=own, attributes={"x": b"\x00\xff", "": "", "zero": 0, "f": False}),
        span("predict", status=Status(StatusCode.ERROR, "INVALID_ARGUMENT"), parent=None),
        span("batch", links=[Link(remote), Link(own, {"n": 2})], attributes={"ctr.batch_size": 2}),
        span("long" * 100, attributes={f"k{i}": "v" * 300 for i in range(40)}),
    ]
    assert encode_request(spans) == encode_spans(spans)
    assert encode_request(spans).SerializeToString() != b""
    for odd in (  # written by the SDK's encoder, whole: the same message still
        span("e", events=[Event("retry", {"n": 1}, 7)]),
        span("a", attributes={"list": [1, 2]}),
        span("r", resource=Resource.create({"service.name": "other"})),
    ):
        assert encode_request([*spans, odd]) == encode_spans([*spans, odd])


def test_any_other_sampler_runs_through_the_sdks_tracer(monkeypatch) -> None:
    """OTEL_TRACES_SAMPLER=always_on (not parent-based): every request is started by the SDK's tracer."""
    from serving.observability.spans.sdk import build_tracer
    from serving.observability.tracing import DEFAULTS

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    settings = {**DEFAULTS, "endpoint": f"http://127.0.0.1:{free_port()}", "protocol": "grpc"}
    state = build_tracer({**settings, "service_name": "t", "export_timeout_s": 0.5}, lambda n: None)
    current: ContextVar[Any] = ContextVar("span", default=None)
    start = state["starter"](current, "REST", b"traceparent: ")
    try:
        span, token, answer = start("predict", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00".encode())
        # always_on ignores the unsampled parent, and keeps its trace
        assert span is not None and current.get() is span and span.is_recording()
        assert answer.startswith(f"traceparent: 00-{CLIENT_TRACE}-".encode()) and answer.endswith(b"-01")
        current.reset(token)
        span.end()
    finally:
        state["provider"].shutdown()
