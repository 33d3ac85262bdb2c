"""The OpenTelemetry SDK behind serving/observability/tracing.py: imported only when tracing is on.

A TracerProvider with a parent-based ratio sampler, an OTLP exporter (gRPC or HTTP), and a
BatchSpanProcessor whose queue is bounded: a span that finds it full is dropped and counted, and a failed
export counts its spans as dropped. The SDK's own per-span "Queue full" warning and the exporter's retry
lines are let through at most once a minute (tracing.py warns with the count).

With a parent-based ratio sampler (the file's `sample_ratio`, or OTEL_TRACES_SAMPLER's parentbased_*), the
request path does not go through the SDK's tracer: `request_starter` makes the sampling decision from the
traceparent and the trace id itself (ParentBased(TraceIdRatioBased)'s rule; a test holds it to the SDK's),
an unsampled request gets only the traceparent to answer, and a sampled one a `RequestSpan`, handed to the
processor as a finished ReadableSpan when it ends. Any other sampler runs through the SDK on every request.
The gRPC exporter writes its requests with serving/observability/otlp_wire.py.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
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
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving.observability.otlp_wire import encode_request

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

        class WireExporter(GrpcExporter):
            """The SDK's gRPC exporter, its requests written by otlp_wire (the same message, sooner)."""

            def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
                return encode_request(data)

        exporter: SpanExporter = WireExporter(endpoint=endpoint, timeout=timeout)
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
    rb"^(?!ff)([0-9a-f]{2})-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$"
)
TRACE_ID_LIMIT = (1 << 64) - 1
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


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


class RequestSpan:
    """A sampled request's span while it runs: what tracing.py sets on it, kept in plain fields.

    `end()` hands it to the processor as the finished ReadableSpan the SDK would have made (kind SERVER,
    the tracer's resource and scope); a live SDK span costs several times more to start and end.
    """

    __slots__ = ("_finish", "attributes", "context", "name", "parent", "start_ns", "status")

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        start_ns: int,
        finish: Callable[[RequestSpan], None],
    ) -> None:
        self.name, self.context, self.parent, self.attributes = name, context, parent, attributes
        self.start_ns, self._finish = start_ns, finish
        self.status: Status | None = None

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return True

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Status) -> None:
        self.status = status

    def end(self) -> None:
        self._finish(self)


# start(name, traceparent) -> (span or None, the context token for tracing.end, the traceparent to answer)
Starter = Callable[[str, bytes], "tuple[Any, Any, bytes]"]


def request_starter(
    ratio: float,
    now_ns: Callable[[], int],
    finish: Callable[[RequestSpan], None],
    current: ContextVar[Any],
    entrypoint: str,
    prefix: bytes = b"",
) -> Starter:
    """`start(name, traceparent) -> (span, token, prefix + the traceparent to answer)`, without the SDK.

    ParentBased(TraceIdRatioBased(ratio))'s decision: a valid parent (the W3C rules, lower-case hex only,
    as the SDK's propagator) is followed, sampled or not; a root (no parent, or a malformed one) is
    sampled when its trace id's low 64 bits are under ratio * 2^64. An unsampled request gets span and
    token None; one that sent a traceparent gets it back with its own span id (a regex match, a random number
    and one formatting), an unsampled root gets b"" (nothing is answered: its trace is recorded nowhere);
    a sampled one's span is made `current` (the token resets it). `prefix`: what the answer is written
    after (REST's header name, so the router appends it as it is).
    """
    bound = round(ratio * (TRACE_ID_LIMIT + 1))
    unsampled, sampled = prefix + b"00-%s-%016x-00", prefix + b"00-%032x-%016x-01"

    def start(name: str, traceparent: bytes) -> tuple[RequestSpan | None, Any, bytes]:
        parent = None
        if traceparent:
            match = _TRACEPARENT.match(traceparent.strip())
            if match is not None and (match.group(1) != b"00" or match.group(5) is None):
                flags = int(match.group(4), 16)
                if not flags & 1:  # an unsampled parent: followed, nothing recorded
                    return None, None, unsampled % (match.group(2), getrandbits(64) or 1)
                trace_id = int(match.group(2), 16)
                parent = SpanContext(trace_id, int(match.group(3), 16), True, TraceFlags(flags))
        if parent is None:
            trace_id = getrandbits(128) or 1
            if trace_id & TRACE_ID_LIMIT >= bound:  # recorded nowhere: no id to hand back
                return None, None, b""
        span_id = getrandbits(64) or 1
        context = SpanContext(trace_id, span_id, False, _SAMPLED)
        span = RequestSpan(name, context, parent, {"ctr.entrypoint": entrypoint}, now_ns(), finish)
        return span, current.set(span), sampled % (trace_id, span_id)

    return start


def _sampler(ratio: float | None) -> Sampler:
    """With the fast decision (a parent-based ratio), the SDK only follows parents and keeps every root it
    is given; with any other OTEL_TRACES_SAMPLER, the SDK's own."""
    return ParentBased(ALWAYS_ON) if ratio is not None else _get_from_env_or_default()


def build_tracer(settings: dict[str, Any], on_drop: Callable[[int], None]) -> dict[str, Any]:
    """The provider and the calls tracing.py makes on the request path (`start`, `record`, `set_error`)."""
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
    offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter stamps to span times

    def now_ns() -> int:
        return offset_ns + time.perf_counter_ns()

    def sdk_starter(current: ContextVar[Any], entrypoint: str, prefix: bytes = b"") -> Starter:
        """Any other sampler than a parent-based ratio: the SDK's tracer on every request."""

        def start(name: str, traceparent: bytes) -> tuple[Any, Any, bytes]:
            context: Context | None = None
            if traceparent:  # malformed: an empty context
                context = propagator.extract({"traceparent": traceparent.decode("latin-1")})
            span = tracer.start_span(
                name, context=context, kind=SpanKind.SERVER, attributes={"ctr.entrypoint": entrypoint}
            )
            ctx = span.get_span_context()
            answer = prefix + b"00-%032x-%016x-%02x" % (ctx.trace_id, ctx.span_id, ctx.trace_flags)
            if not span.is_recording():
                return None, None, answer
            return span, current.set(span), answer

        return start

    # Spans are finished when they are made (from timestamps taken on the way): built as the ReadableSpan
    # the processor gets, they skip the SDK's live-span machinery.
    scope, processor = InstrumentationScope("ctr-serving"), provider_processor

    def finish(span: RequestSpan) -> None:
        processor.on_end(
            ReadableSpan(
                name=span.name,
                context=span.context,
                parent=span.parent,
                resource=resource,
                attributes=span.attributes,
                kind=SpanKind.SERVER,
                instrumentation_scope=scope,
                status=span.status or _UNSET,
                start_time=span.start_ns,
                end_time=now_ns(),
            )
        )

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
        # starter(current, entrypoint, prefix): tracing.py makes one for REST and one for gRPC
        "starter": sdk_starter
        if ratio is None
        else functools.partial(request_starter, ratio, now_ns, finish),
        "record": record,
        "set_error": set_error,
        "offset_ns": offset_ns,
        "protocol": protocol,
        "endpoint": endpoint,
    }
