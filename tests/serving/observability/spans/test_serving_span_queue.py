"""The span queue, its wire bytes and its export process (serving/observability/spans/) against real receivers.

A sampled request's spans, made by the request path's own calls (`starter`, `child`, `batch`), reach a real
OTLP receiver over gRPC and over HTTP with their tree, attributes and links; the bytes are the SDK encoder's
message; a full queue drops and counts without waiting, whatever the collector does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from serving.observability.spans.otlp_wire import encode_records, record_of, scope_head
from serving.observability.spans.sdk import build_tracer
from serving.observability.tracing import DEFAULTS
from tests.serving.otlp_receiver import OtlpReceiver

CLIENT_TRACE, CLIENT_SPAN = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7


class _HttpReceiver:
    """OTLP/HTTP's traces endpoint (POST /v1/traces, protobuf): keeps each request's span names and ids."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, int]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            receiver.spans.append((span.name, int.from_bytes(span.trace_id, "big")))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.stop()


def _tracer(endpoint: str, protocol: str = "grpc", **settings: Any) -> tuple[dict[str, Any], list[int]]:
    drops: list[int] = []
    given = {**DEFAULTS, "endpoint": endpoint, "protocol": protocol, "sample_ratio": 1.0, "service_name": "t"}
    return build_tracer({**given, "schedule_delay_ms": 50, **settings}, drops.append), drops


def _one_request(state: dict[str, Any], traceparent: bytes = b"") -> Any:
    """The calls one batched, sampled request makes (tracing.py's, as the router, predictor and batcher)."""
    current: ContextVar[Any] = ContextVar("span", default=None)
    span, token, _ = state["starter"](current, "REST")("predict", traceparent)
    now = time.perf_counter()
    time.sleep(0.002)  # the children's stamps lie in the past, inside the request's span
    state["child"](span, "decode", now, now + 0.0005)
    span.set_attributes({"ctr.model.name": "ctr", "ctr.model.version": 3, "ctr.batch_size": 1})
    batch = state["batch"]([span], now + 0.0008, now + 0.0016, 2)
    state["child"](batch, "model_run", now + 0.001, now + 0.0015)
    state["set_error"](span, "INVALID_ARGUMENT")
    current.reset(token)
    span.end()
    return span


def test_a_sampled_requests_spans_reach_the_grpc_receiver_whole(receiver: OtlpReceiver) -> None:
    state, drops = _tracer(receiver.endpoint)
    try:
        traceparent = b"00-%032x-%016x-01" % (CLIENT_TRACE, CLIENT_SPAN)
        span = _one_request(state, traceparent)
        state["provider"].force_flush()
        spans = receiver.wait(lambda: (t := receiver.trace(f"{CLIENT_TRACE:032x}")) and len(t) >= 4 and t)
    finally:
        state["provider"].shutdown()
    by_name = {s["name"]: s for s in spans}
    root, batch = by_name["predict"], by_name["batch"]
    assert root["span_id"] == f"{span.span_id:016x}" and root["parent_span_id"] == f"{CLIENT_SPAN:016x}"
    assert root["kind"] == "SERVER" and root["status"] == StatusCode.ERROR.value and root["service"] == "t"
    assert root["attributes"] == {
        "ctr.entrypoint": "REST",
        "ctr.model.name": "ctr",
        "ctr.model.version": 3,
        "ctr.batch_size": 1,
    }
    assert by_name["decode"]["parent_span_id"] == batch["parent_span_id"] == root["span_id"]
    assert by_name["model_run"]["parent_span_id"] == batch["span_id"]
    assert batch["links"] == [(f"{CLIENT_TRACE:032x}", root["span_id"])]
    assert batch["attributes"] == {"ctr.batch_size": 2} and batch["kind"] == "INTERNAL"
    assert (
        root["start_ns"] <= by_name["decode"]["start_ns"] <= by_name["model_run"]["end_ns"] <= root["end_ns"]
    )
    assert drops == []


def test_the_http_exporter_sends_the_same_bytes() -> None:
    http = _HttpReceiver()
    state, drops = _tracer(http.endpoint, "http/protobuf")
    try:
        span = _one_request(state)
        state["provider"].force_flush()
        deadline = time.monotonic() + 10
        while len(http.spans) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        state["provider"].shutdown()
        http.stop()
    assert sorted(http.spans) == sorted(
        (n, span.trace_id) for n in ("predict", "decode", "batch", "model_run")
    )
    assert drops == []


def test_a_full_queue_drops_and_counts_without_waiting() -> None:
    slow = OtlpReceiver(delay_s=2.0)
    state, drops = _tracer(slow.endpoint, max_queue_size=8, export_timeout_s=1)
    try:
        started = time.perf_counter()
        for _ in range(50):
            _one_request(state)  # 4 spans each
        took = time.perf_counter() - started
        assert took < 0.5, f"200 spans took {took:.3f}s to record with the collector slow"
        # what the queue held, the batch waiting for the export process, and the one it is sending
        assert sum(drops) >= 200 - 3 * 8
    finally:
        threading.Thread(target=state["provider"].shutdown, daemon=True).start()
        slow.stop()


def test_records_are_written_as_the_sdks_encoder_writes_spans() -> None:
    """encode_records' bytes parse to `encode_spans`' message; an SDK span a record cannot hold is written by
    the SDK's encoder and appended (two requests' bytes, concatenated, are their merge)."""
    resource, scope = Resource.create({"service.name": "ctr-serving"}), InstrumentationScope("ctr-serving")
    remote = SpanContext(CLIENT_TRACE, CLIENT_SPAN, True, TraceFlags(1))
    own = SpanContext(CLIENT_TRACE, 0xAB, False, TraceFlags(1))

    def span(name: str, **fields: Any) -> ReadableSpan:
        values = {"context": own, "parent": own, "start_time": 10**18, "end_time": 10**18 + 5}
        return ReadableSpan(name=name, resource=resource, instrumentation_scope=scope, **{**values, **fields})

    spans = [
        span("predict", parent=remote, kind=SpanKind.SERVER, attributes={"ctr.status": "OK", "n": -3}),
        span("decode"),  # a plain child
        span("predict", parent=None, status=Status(StatusCode.ERROR, "UNAVAILABLE")),
        span("batch", links=[Link(remote), Link(own, {"n": 2})], attributes={"ctr.batch_size": 2}),
    ]
    head = scope_head(resource, scope)
    assert head is not None
    records = [record_of(s) for s in spans]
    written = encode_records(records, head)  # type: ignore[arg-type]
    assert written is not None and ExportTraceServiceRequest.FromString(written) == encode_spans(spans)
    odd = span("with a state", context=SpanContext(CLIENT_TRACE, 0xCD, False, TraceFlags(1), None))
    odd_state = ReadableSpan(
        name="traced state",
        context=SpanContext(CLIENT_TRACE, 0xEF, False, TraceFlags(1), trace_state=_state("k=v")),
        resource=resource,
        instrumentation_scope=scope,
        start_time=1,
        end_time=2,
    )
    assert record_of(odd) is not None and record_of(odd_state) is None
    merged = ExportTraceServiceRequest.FromString(written + encode_spans([odd_state]).SerializeToString())
    assert list(merged.resource_spans) == [
        *encode_spans(spans).resource_spans,
        *encode_spans([odd_state]).resource_spans,
    ]


def _state(header: str) -> Any:
    from opentelemetry.trace.span import TraceState

    return TraceState.from_header([header])


def test_a_root_the_router_drew_keeps_its_bits() -> None:
    """The REST router draws a root's 64 bits itself (tracing.ROOT_BOUND) and starts only those it samples:
    the trace id's low half is those bits, so the decision stays TraceIdRatioBased's downstream."""
    from serving.observability.spans.sdk import request_starter, root_bound

    finished: list[Any] = []
    current: ContextVar[Any] = ContextVar("span", default=None)
    start = request_starter(0.25, time.time_ns, finished.append, current, "REST", b"traceparent: ")
    bound = root_bound(0.25)
    assert bound == 2**62 and root_bound(None) == 2**64
    span, token, answer = start("predict", b"", bound - 1)
    assert span.trace_id & (2**64 - 1) == bound - 1 and span.parent is None
    assert answer == b"traceparent: 00-%032x-%016x-01" % (span.trace_id, span.span_id)
    current.reset(token)
    assert start("predict", b"", bound) == (None, None, b"")
    assert start("predict", b"garbage", bound) == (None, None, b"")  # malformed: a root, its bits decide
    followed, _, answered = start("predict", b"00-%032x-%016x-00" % (CLIENT_TRACE, CLIENT_SPAN), 0)
    assert followed is None and answered.startswith(b"traceparent: 00-%032x-" % CLIENT_TRACE)
