"""The OpenTelemetry SDK behind serving/observability/tracing.py: imported only when tracing is on.

Spans leave through otlp_wire.py's `SpanQueue`: a bounded queue (a span that finds it full is dropped and
counted) and a thread that sends them in batches, their requests written as wire bytes; the spans of a failed
export are counted as dropped. The exporters are the SDK's OTLP ones (gRPC or HTTP: their channel, TLS,
headers, retries), handed those bytes in a process of their own (export_process.py). Their retry lines are let
through at most once a minute (tracing.py warns with the count).

With a parent-based ratio sampler (the file's `sample_ratio`, or OTEL_TRACES_SAMPLER's parentbased_*), the
request path does not go through the SDK's tracer: `request_starter` makes the sampling decision from the
traceparent and the trace id itself (ParentBased(TraceIdRatioBased)'s rule; a test holds it to the SDK's),
an unsampled request gets only the traceparent to answer, and a sampled one a `RequestSpan`, queued as a
record when it ends; its children are records from the start. Any other sampler runs through the SDK on
every request, its spans queued by the same `SpanQueue` (the provider's span processor).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from contextvars import ContextVar
from random import getrandbits
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    ParentBased,
    Sampler,
    _get_from_env_or_default,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving.observability.spans.export_process import ExportProcess, endpoint_of, quiet_exporter_logs
from serving.observability.spans.otlp_wire import INTERNAL, SERVER, SpanQueue

# W3C trace context: version-traceid-parentid-flags (version ff, an all-zero id: invalid)
_TRACEPARENT = re.compile(
    rb"^(?!ff)([0-9a-f]{2})-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$"
)
TRACE_ID_LIMIT = (1 << 64) - 1
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOTHING = (None, None, b"")  # an unsampled root: no span, nothing answered


class RequestSpan:
    """A sampled request's span while it runs: what tracing.py sets on it, kept in plain fields.

    `end()` queues it as a record (kind SERVER); a live SDK span costs several times more to start and end.
    `context` is its SpanContext, `parent` the remote parent's (None: a root).
    """

    __slots__ = ("_finish", "attributes", "name", "parent", "span_id", "start_ns", "status", "trace_id")

    def __init__(
        self,
        name: str,
        ids: tuple[int, int],
        parent: SpanContext | None,
        attributes: dict[str, Any],
        start_ns: int,
        finish: Callable[[RequestSpan], None],
    ) -> None:
        self.name, (self.trace_id, self.span_id), self.parent, self.attributes = name, ids, parent, attributes
        self.start_ns, self._finish = start_ns, finish
        self.status: tuple[int, str] | None = None  # (OTLP's code, description); None: UNSET

    @property
    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, False, _SAMPLED)

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return True

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Status) -> None:
        self.status = status.status_code.value, status.description or ""

    def end(self) -> None:
        self._finish(self)


# start(name, traceparent, low=None) -> (span or None, the context token for tracing.end, the traceparent to
# answer); `low`: a root's 64 random bits when the caller drew them (tracing.ROOT_BOUND)
Starter = Callable[..., "tuple[Any, Any, bytes]"]


def root_bound(ratio: float | None) -> int:
    """A root is sampled when its trace id's low 64 bits are under this (TraceIdRatioBased's rule); with any
    other sampler than a parent-based ratio, 2^64: every request goes to the SDK's."""
    return TRACE_ID_LIMIT + 1 if ratio is None else round(ratio * (TRACE_ID_LIMIT + 1))


def request_starter(
    ratio: float,
    now_ns: Callable[[], int],
    finish: Callable[[RequestSpan], None],
    current: ContextVar[Any],
    entrypoint: str,
    prefix: bytes = b"",
) -> Starter:
    """`start(name, traceparent, low=None) -> (span, token, prefix + the traceparent to answer)`, without the SDK.

    ParentBased(TraceIdRatioBased(ratio))'s decision: a valid parent (the W3C rules, lower-case hex only,
    as the SDK's propagator) is followed, sampled or not; a root (no parent, or a malformed one) is
    sampled when its trace id's low 64 bits are under ratio * 2^64. An unsampled root, most requests, costs
    a test and one random number (those low 64 bits: the high ones are drawn only for a sampled root), gets
    span and token None and answers b"" (its trace is recorded nowhere); an unsampled request that sent a
    traceparent gets it back with its own span id (a regex match, a random number and one formatting). A
    sampled one's span is made `current` (the token resets it). `prefix`: what the answer is written after
    (REST's header name, so the router appends it as it is). `low`: a root's low 64 bits, drawn by the caller
    (the REST router draws them itself, and starts only the roots they sample); else drawn here.
    """
    bound = root_bound(ratio)
    unsampled, sampled = prefix + b"00-%s-%016x-00", prefix + b"00-%032x-%016x-01"

    def start(name: str, traceparent: bytes, low: int | None = None) -> tuple[RequestSpan | None, Any, bytes]:
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
            if low is None:
                low = getrandbits(64)
            if low >= bound:  # recorded nowhere: no id to hand back
                return _NOTHING
            trace_id = getrandbits(64) << 64 | low or 1
        span_id = getrandbits(64) or 1
        span = RequestSpan(
            name, (trace_id, span_id), parent, {"ctr.entrypoint": entrypoint}, now_ns(), finish
        )
        return span, current.set(span), sampled % (trace_id, span_id)

    return start


def _sampler(ratio: float | None) -> Sampler:
    """With the fast decision (a parent-based ratio), the SDK only follows parents and keeps every root it
    is given; with any other OTEL_TRACES_SAMPLER, the SDK's own."""
    return ParentBased(ALWAYS_ON) if ratio is not None else _get_from_env_or_default()


def _queue_sizes(settings: dict[str, Any]) -> tuple[tuple[int, int], float]:
    """((max_queue_size, the export batch's size), schedule delay s): the file's, else OTEL_BSP_*'s (as the
    SDK's BatchSpanProcessor reads and checks them)."""
    given = settings["max_queue_size"]
    max_size = BatchSpanProcessor._default_max_queue_size() if given is None else int(given)
    batch = BatchSpanProcessor._default_max_export_batch_size() if given is None else min(512, max_size)
    delay = settings["schedule_delay_ms"]
    delay = BatchSpanProcessor._default_schedule_delay_millis() if delay is None else float(delay)
    BatchSpanProcessor._validate_arguments(max_size, delay, batch)
    return (max_size, batch), delay / 1e3


def build_tracer(settings: dict[str, Any], on_drop: Callable[[int], None]) -> dict[str, Any]:
    """The provider and the calls tracing.py makes on the request path (`starter`, `child`, `batch`,
    `set_error`). `settings["sample_ratio"]`: a parent-based ratio sampler's root ratio (tracing.root_ratio),
    None for any other OTEL_TRACES_SAMPLER (the SDK's, on every request)."""
    quiet_exporter_logs()
    protocol, endpoint = endpoint_of(settings)
    exporter = ExportProcess(settings, on_drop)  # the SDK's exporter, in a process of its own
    resource = Resource.create({"service.name": settings["service_name"]})
    scope = InstrumentationScope("ctr-serving")
    sizes, delay_s = _queue_sizes(settings)
    queue = SpanQueue(exporter, resource, scope, on_drop, sizes, delay_s)
    ratio = None if settings["sample_ratio"] is None else float(settings["sample_ratio"])
    provider = TracerProvider(sampler=_sampler(ratio), resource=resource)
    provider.add_span_processor(queue)
    tracer = provider.get_tracer("ctr-serving")
    propagator = TraceContextTextMapPropagator()
    offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter stamps to span times

    def now_ns() -> int:
        return offset_ns + time.perf_counter_ns()

    def sdk_starter(current: ContextVar[Any], entrypoint: str, prefix: bytes = b"") -> Starter:
        """Any other sampler than a parent-based ratio: the SDK's tracer on every request."""

        def start(name: str, traceparent: bytes, low: int | None = None) -> tuple[Any, Any, bytes]:
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

    # Spans are finished when they are made (from timestamps taken on the way): records, queued as they are
    # (SpanQueue.put, written out: these run several times a sampled request).
    records, (max_size, batch_size), wake, put = queue.records, sizes, queue.wake.set, queue.put

    def finish(span: RequestSpan) -> None:
        parent = span.parent
        put(
            (
                span.trace_id,
                span.span_id,
                0 if parent is None else parent.span_id,
                parent is not None,  # a request's parent is the client's
                span.name,
                SERVER,
                span.start_ns,
                now_ns(),
                span.attributes,
                (),
                span.status,
            )
        )

    def child(parent: Any, name: str, start_s: float, end_s: float | None = None, **attributes: Any) -> Any:
        """tracing.child: a finished child of `parent` (a RequestSpan, what child or batch returned, an SDK
        span) from perf_counter stamps (end: now), queued; returns its (trace id, span id)."""
        if parent.__class__ is tuple:
            trace_id, up = parent
        elif parent.__class__ is RequestSpan:
            trace_id, up = parent.trace_id, parent.span_id
        else:  # the SDK's span
            context = parent.get_span_context()
            if not context.trace_flags.sampled:  # recorded, not sampled: neither it nor its children leave
                return parent
            trace_id, up = context.trace_id, context.span_id
        span_id = getrandbits(64) or 1
        end_ns = time.perf_counter_ns() if end_s is None else int(end_s * 1e9)
        if len(records) >= max_size:
            on_drop(1)
            return trace_id, span_id
        records.append(
            (
                trace_id,
                span_id,
                up,
                False,
                name,
                INTERNAL,
                offset_ns + int(start_s * 1e9),
                offset_ns + end_ns,
                attributes or None,
                (),
                None,
            )
        )
        if len(records) == batch_size:
            wake()
        return trace_id, span_id

    def batch(parents: list[Any], start_s: float, end_s: float, rows: int) -> Any:
        """tracing.batch: the span of one model call, the child of the first traced request and linked to
        each of them; returns its (trace id, span id)."""
        first = parents[0]
        if first.__class__ is not RequestSpan and not first.get_span_context().trace_flags.sampled:
            return first  # the SDK's, recorded but not sampled: neither the batch nor its children leave
        ids = [(p.trace_id, p.span_id) if p.__class__ is RequestSpan else p.context[:2] for p in parents]
        trace_id, up = ids[0]
        span_id = getrandbits(64) or 1
        start_ns, end_ns = offset_ns + int(start_s * 1e9), offset_ns + int(end_s * 1e9)
        links = tuple((t, s, False, None) for t, s in ids)
        put(
            (
                trace_id,
                span_id,
                up,
                False,
                "batch",
                INTERNAL,
                start_ns,
                end_ns,
                {"ctr.batch_size": rows},
                links,
                None,
            )
        )
        return trace_id, span_id

    def set_error(span: Any, code: str) -> None:
        span.set_status(Status(StatusCode.ERROR, code))

    return {
        "provider": provider,
        # starter(current, entrypoint, prefix): tracing.py makes one for REST and one for gRPC
        "starter": sdk_starter
        if ratio is None
        else functools.partial(request_starter, ratio, now_ns, finish),
        "child": child,
        "batch": batch,
        "root_bound": root_bound(ratio),
        "set_error": set_error,
        "protocol": protocol,
        "endpoint": endpoint,
    }
