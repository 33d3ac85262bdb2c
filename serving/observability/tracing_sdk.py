"""The OpenTelemetry SDK behind serving/observability/tracing.py: imported only when tracing is on.

A TracerProvider with a parent-based ratio sampler, an OTLP exporter (gRPC or HTTP), and a
BatchSpanProcessor whose queue is bounded: a span that finds it full is dropped and counted, and a failed
export counts its spans as dropped. The SDK's own per-span "Queue full" warning and the exporter's retry
lines are let through at most once a minute (tracing.py warns with the count).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from random import getrandbits
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    ParentBased,
    Sampler,
    _get_from_env_or_default,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

QUIET_LOGGERS = (
    "opentelemetry.sdk._shared_internal",  # "Queue full, dropping spans." once per span
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)


class _OncePerMinute(logging.Filter):
    """Lets one record a minute through (per logger)."""

    def __init__(self) -> None:
        super().__init__()
        self._last = -60.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last < 60.0:
            return False
        self._last = now
        return True


class _CountingExporter(SpanExporter):
    """The OTLP exporter; the spans of an export that fails are counted as dropped."""

    def __init__(self, inner: SpanExporter, on_drop: Callable[[int], None]) -> None:
        self._inner, self._on_drop = inner, on_drop

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:  # an exporter bug must not stop the processor's thread
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._on_drop(len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _DroppingProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans its full queue drops (it never blocks the caller)."""

    def __init__(self, exporter: SpanExporter, on_drop: Callable[[int], None], **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        self._on_drop = on_drop
        inner = getattr(self, "_batch_processor", None)
        self._queue = getattr(inner, "_queue", None)  # a deque(maxlen=max_queue_size): appends past it drop

    def on_end(self, span: ReadableSpan) -> None:
        queue = self._queue
        if queue is not None and queue.maxlen is not None and len(queue) >= queue.maxlen:
            self._on_drop(1)
        super().on_end(span)


def _exporter(settings: dict[str, Any]) -> tuple[SpanExporter, str, str]:
    protocol = settings["protocol"] or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    )
    endpoint = settings["endpoint"]
    timeout = float(settings["export_timeout_s"])
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter: SpanExporter = GrpcExporter(endpoint=endpoint, timeout=timeout)
        return (
            exporter,
            protocol,
            str(endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317")),
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # as the SDK appends it to OTEL_EXPORTER_OTLP_ENDPOINT
    exporter = HttpExporter(endpoint=endpoint, timeout=timeout)
    return (
        exporter,
        "http/protobuf",
        str(endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")),
    )


# W3C trace context: version-traceid-parentid-flags (version ff, an all-zero id: invalid)
_TRACEPARENT = re.compile(
    rb"^(?!ff)([0-9a-f]{2})-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-([0-9a-f]{2})(-.*)?$"
)
TRACE_ID_LIMIT = (1 << 64) - 1


def _ratio(ratio: float | None) -> float | None:
    """The root sampling ratio of a parent-based ratio sampler (the file's, or OTEL_TRACES_SAMPLER's
    parentbased_* ones); None for any other sampler, which the SDK then runs on every request."""
    if ratio is not None:
        return float(ratio)
    name = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    fixed = {"parentbased_always_on": 1.0, "parentbased_always_off": 0.0}
    if name in fixed:
        return fixed[name]
    if name == "parentbased_traceidratio":
        try:
            value = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
        except ValueError:
            return 1.0  # as the SDK does with an argument that is no number
        return value if 0.0 <= value <= 1.0 else 1.0
    return None


def unsampled_answer(ratio: float) -> Callable[[bytes], bytes | None]:
    """The parent-based ratio decision without the SDK: the traceparent to answer when the request is not
    sampled (a new span id; the caller's trace, or a new one), or None when it is (the SDK then makes it).

    What the SDK's ParentBased(TraceIdRatioBased(ratio)) decides, at a fraction of the SDK's cost (the
    figures: docs/perf/tracing.md): a sampled parent is followed, an unsampled one too, and a root (no
    parent, or a malformed one) is sampled when its trace id's low 64 bits are under ratio * 2^64.
    """
    bound = round(ratio * (TRACE_ID_LIMIT + 1))

    def decide(traceparent: bytes) -> bytes | None:
        if traceparent:
            parent = _TRACEPARENT.match(traceparent.strip())  # lower-case hex only, as W3C and the SDK
            if parent is not None and (parent.group(1) != b"00" or parent.group(4) is None):
                if int(parent.group(3), 16) & 1:
                    return None  # a sampled parent: recorded
                return b"00-%s-%016x-00" % (parent.group(2), getrandbits(64))
        trace_id = getrandbits(128)
        if trace_id & TRACE_ID_LIMIT < bound:
            return None  # a sampled root: the SDK makes it under ALWAYS_ON, so the ratio applies once
        return b"00-%032x-%016x-00" % (trace_id, getrandbits(64))

    return decide


def _sampler(ratio: float | None) -> Sampler:
    """With the fast decision (a parent-based ratio), the SDK only follows parents and keeps every root it
    is given; with any other OTEL_TRACES_SAMPLER, the SDK's own."""
    return ParentBased(ALWAYS_ON) if ratio is not None else _get_from_env_or_default()


def build_tracer(settings: dict[str, Any], on_drop: Callable[[int], None]) -> dict[str, Any]:
    """The provider and the three calls tracing.py makes on the request path."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).addFilter(_OncePerMinute())
    exporter, protocol, endpoint = _exporter(settings)
    batch_options: dict[str, Any] = {}
    if settings["max_queue_size"] is not None:
        batch_options["max_queue_size"] = int(settings["max_queue_size"])
        batch_options["max_export_batch_size"] = min(512, batch_options["max_queue_size"])
    if settings["schedule_delay_ms"] is not None:
        batch_options["schedule_delay_millis"] = float(settings["schedule_delay_ms"])
    resource = Resource.create({"service.name": settings["service_name"]})
    ratio = _ratio(settings["sample_ratio"])
    provider = TracerProvider(sampler=_sampler(ratio), resource=resource)
    provider_processor = _DroppingProcessor(_CountingExporter(exporter, on_drop), on_drop, **batch_options)
    provider.add_span_processor(provider_processor)
    tracer = provider.get_tracer("ctr-serving")
    propagator = TraceContextTextMapPropagator()

    def begin(name: str, traceparent: str | bytes | None, entrypoint: str) -> Any:
        context: Context | None = None
        if traceparent:
            if isinstance(traceparent, bytes):
                traceparent = traceparent.decode("latin-1")
            context = propagator.extract({"traceparent": traceparent})  # malformed: an empty context
        return tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, attributes={"ctr.entrypoint": entrypoint}
        )

    # The children are finished when they are made (from timestamps taken on the way): built as the
    # ReadableSpan the processor gets, they skip the SDK's live-span machinery (a fifth of the cost).
    scope, processor = InstrumentationScope("ctr-serving"), provider_processor

    def record(parent: Any, name: str, start_ns: int, end_ns: int, attributes: Any, linked: Any) -> Any:
        up = parent if isinstance(parent, SpanContext) else parent.get_span_context()
        context = SpanContext(up.trace_id, getrandbits(64) or 1, False, up.trace_flags)
        links = [Link(s.get_span_context()) for s in linked] if linked else ()
        span = ReadableSpan(
            name=name,
            context=context,
            parent=up,
            resource=resource,
            attributes=attributes,
            links=links,
            kind=SpanKind.INTERNAL,
            instrumentation_scope=scope,
            start_time=start_ns,
            end_time=end_ns,
        )
        processor.on_end(span)
        return context

    def set_error(span: Any, code: str) -> None:
        span.set_status(Status(StatusCode.ERROR, code))

    return {
        "provider": provider,
        "begin": begin,
        "record": record,
        "set_error": set_error,
        "unsampled": None if ratio is None else unsampled_answer(ratio),
        "protocol": protocol,
        "endpoint": endpoint,
    }
