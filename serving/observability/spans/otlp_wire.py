"""Spans off the request path: kept as plain records, queued, written as OTLP wire bytes and sent in batches.

A sampled request's spans are `SpanRecord` tuples (serving/observability/spans/sdk.py makes them); `SpanQueue`
keeps them in a bounded queue (a record that finds it full is dropped and counted, never waited for) and its
thread sends them in batches: `encode_records` writes the ExportTraceServiceRequest's protobuf bytes straight
from the records, which the exporter sends as they are. The SDK's BatchSpanProcessor, ReadableSpan and encoder
cost ten times more a span, on threads that hold the GIL the event loop needs
(docs/decisions/0009-own-span-queue.md). tests/serving/observability/test_serving_tracing.py holds the bytes to the
SDK's encoder (`encode_spans`), field for field. A ReadableSpan given by the SDK's own tracer (a sampler other
than a parent-based ratio) is turned into a record; one with what a record does not hold (events, a trace state,
array attribute values, dropped counts) goes to the SDK's encoder, and its message is appended to the request
(two messages' bytes, concatenated, are their merge).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

log = logging.getLogger(__name__)

# (trace_id, span_id, parent span id (0: a root), the parent is remote, name, kind (OTLP's: 1 INTERNAL,
#  2 SERVER), start ns, end ns, attributes (or None), links ((trace_id, span_id, remote, attributes), ...),
#  status ((code, description) or None: UNSET))
SpanRecord = tuple[int, int, int, bool, str, int, int, int, Any, tuple, Any]
INTERNAL, SERVER = 1, 2
_KINDS = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}  # SpanKind -> OTLP's enum
HAS_IS_REMOTE, IS_REMOTE = 0x100, 0x200  # OTLP's SpanFlags masks
_LOW = (1 << 64) - 1
_pack_d = struct.Struct("<d").pack
_ids = struct.Struct(">HQQHQ").pack  # trace_id (two halves) and span_id, each after its tag and length
_parent = struct.Struct(">HQ").pack
_child_ids = struct.Struct(">HQQHQHQ").pack  # and the parent's span_id
_times = struct.Struct("<BQBQ").pack  # start and end, fixed64 each
_FLAGS = {False: b"\x85\x01" + struct.pack("<I", HAS_IS_REMOTE), True: b"\x85\x01" + struct.pack("<I", 0x300)}
_LINK_FLAGS = {False: b"\x35" + struct.pack("<I", HAS_IS_REMOTE), True: b"\x35" + struct.pack("<I", 0x300)}
_UNSET = b"\x7a\x00"
_PLAIN_TAIL = _UNSET + _FLAGS[False]  # a child's: status UNSET, a local parent


_SHORT = [bytes((n,)) for n in range(0x80)]  # a varint under 128: one byte


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _varint(n)) + payload


def _value(value: Any) -> bytes | None:
    """An AnyValue's fields (the SDK's order of type tests); None for what only the SDK's encoder writes."""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement, 10 bytes when < 0
    if isinstance(value, float):
        return b"\x21" + _pack_d(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    return None


_KEY_VALUES: dict[tuple[bytes, str, type, Any], bytes] = {}  # a server's attributes repeat: encoded once
_MAX_KEY_VALUES = 4096


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes | None:
    """Each attribute as a KeyValue field under `tag`; None when one needs the SDK's encoder."""
    if not attributes:
        return b""
    out = []
    for key, value in attributes.items():
        try:
            cache_key = (tag, key, value.__class__, value)  # the class too: True == 1 == 1.0
            encoded = _KEY_VALUES.get(cache_key)
        except TypeError:  # unhashable: a list
            return None
        if encoded is None:
            any_value = _value(value)
            if any_value is None:
                return None
            encoded = _field(tag, _field(b"\x0a", key.encode()) + _field(b"\x12", any_value))
            if len(_KEY_VALUES) >= _MAX_KEY_VALUES:
                _KEY_VALUES.clear()
            _KEY_VALUES[cache_key] = encoded
        out.append(encoded)
    return b"".join(out)


_NAMES: dict[tuple[str, int], bytes] = {}  # (name, kind) -> its fields: a server's few names, encoded once


def _named(name: str, kind: int) -> bytes:
    named = _NAMES[name, kind] = _field(b"\x2a", name.encode()) + b"\x30" + _varint(kind)
    return named


def _span(record: SpanRecord) -> bytes | None:
    """One Span message's field (its tag, length and bytes); None when an attribute needs the SDK's encoder."""
    trace_id, span_id, parent, remote, name, kind, start, end, attributes, links, status = record
    named = _NAMES.get((name, kind)) or _named(name, kind)
    if attributes is None and status is None and not links and parent and not remote:  # most: a plain child
        one = b"".join(
            (
                _child_ids(0x0A10, trace_id >> 64, trace_id & _LOW, 0x1208, span_id, 0x2208, parent),
                named,
                _times(0x39, start, 0x41, end),
                _PLAIN_TAIL,
            )
        )
        n = len(one)
        return b"\x12" + (_SHORT[n] if n < 0x80 else _varint(n)) + one
    encoded = _attributes(b"\x4a", attributes)
    if encoded is None:
        return None
    head = _ids(0x0A10, trace_id >> 64, trace_id & _LOW, 0x1208, span_id)
    if parent:
        head += _parent(0x2208, parent)
    parts = [head, named, _times(0x39, start, 0x41, end), encoded]
    for link_trace, link_span, link_remote, link_attributes in links:
        link_encoded = _attributes(b"\x22", link_attributes)
        if link_encoded is None:
            return None
        ids = _ids(0x0A10, link_trace >> 64, link_trace & _LOW, 0x1208, link_span)
        parts.append(_field(b"\x6a", ids + link_encoded + _LINK_FLAGS[link_remote]))
    if status is None:
        parts.append(_UNSET)
    else:
        code, message = status
        written = _field(b"\x12", message.encode()) if message else b""
        parts.append(_field(b"\x7a", written + (b"\x18" + _varint(code) if code else b"")))
    parts.append(_FLAGS[remote])
    one = b"".join(parts)
    return b"\x12" + _varint(len(one)) + one


Head = tuple[bytes, bytes, bytes, bytes]


def scope_head(resource: Resource, scope: InstrumentationScope | None) -> Head | None:
    """What a request of one resource and scope writes around its spans: (the ResourceSpans' fields before its
    ScopeSpans, the ScopeSpans' before its spans, the ScopeSpans' after them, the ResourceSpans' after its
    ScopeSpans); None where the SDK's encoder must write it."""
    resource_attributes = _attributes(b"\x0a", resource.attributes)
    scope_fields = b""
    if scope is not None:
        scope_attributes = _attributes(b"\x1a", scope.attributes)
        if scope_attributes is None:
            return None
        scope_fields = _field(b"\x0a", scope.name.encode()) if scope.name else b""
        scope_fields += _field(b"\x12", scope.version.encode()) if scope.version else b""
        scope_fields += scope_attributes
    if resource_attributes is None:
        return None
    scope_after = (
        _field(b"\x1a", scope.schema_url.encode()) if scope is not None and scope.schema_url else b""
    )
    resource_after = _field(b"\x1a", resource.schema_url.encode()) if resource.schema_url else b""
    return _field(b"\x0a", resource_attributes), _field(b"\x0a", scope_fields), scope_after, resource_after


def encode_records(records: Sequence[SpanRecord], head: Head) -> bytes | None:
    """The ExportTraceServiceRequest of `records`, spans of one resource and scope (`scope_head`'s), as bytes;
    None when one needs the SDK's encoder."""
    spans = []
    for record in records:
        one = _span(record)
        if one is None:
            return None
        spans.append(one)
    resource_attributes, scope_fields, scope_after, resource_after = head
    scope_spans = scope_fields + b"".join(spans) + scope_after
    return _field(b"\x0a", resource_attributes + _field(b"\x12", scope_spans) + resource_after)


def record_of(span: ReadableSpan) -> SpanRecord | None:
    """The record of a finished SDK span; None when it has what a record does not hold."""
    context, parent, status = span.context, span.parent, span.status
    if (
        context is None
        or span.events
        or context.trace_state
        or span.dropped_attributes
        or span.dropped_links
        or any(link.context.trace_state for link in span.links)
    ):
        return None
    assert span.start_time is not None and span.end_time is not None
    return (
        context.trace_id,
        context.span_id,
        parent.span_id if parent is not None else 0,
        parent is not None and parent.is_remote,
        span.name,
        _KINDS[span.kind.name],
        span.start_time,
        span.end_time,
        span.attributes,
        tuple((k.context.trace_id, k.context.span_id, k.context.is_remote, k.attributes) for k in span.links),
        (status.status_code.value, status.description or "") if status.status_code.value else None,
    )


def encode_request(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """The ExportTraceServiceRequest of `spans`: the message `encode_spans(spans)` gives."""
    if not spans:
        return encode_spans(spans)
    resource, scope = spans[0].resource, spans[0].instrumentation_scope
    head = scope_head(resource, scope)
    records = [record_of(span) for span in spans]
    if (
        head is None
        or any(r is None for r in records)
        or any(s.resource is not resource or s.instrumentation_scope is not scope for s in spans)
    ):
        return encode_spans(spans)
    encoded = encode_records(records, head)  # type: ignore[arg-type]
    return encode_spans(spans) if encoded is None else ExportTraceServiceRequest.FromString(encoded)


class Encoded:
    """An ExportTraceServiceRequest's bytes (`data`), and the number of spans it carries (`spans`)."""

    __slots__ = ("data", "spans")

    def __init__(self, data: bytes, spans: int) -> None:
        self.data, self.spans = data, spans


class SpanQueue(SpanProcessor):
    """The bounded queue of finished spans, and the thread that sends them (OTEL_BSP_*'s batching).

    `put(record)` is the request path's: an append, or a drop counted when `max_size` are waiting. The thread
    wakes every `delay_s`, or when `batch_size` are waiting, and sends everything queued in requests of at
    most `batch_size` spans (`Encoded`, through `exporter.export`); the spans of a request that fails are
    counted as dropped. As the SDK's span processor (`on_end`), it queues the spans of the SDK's own tracer.
    `records` (the deque) and `wake` are the request path's too: sdk.py's `child`, run several times a
    sampled request, does what `put` does without the call.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        resource: Resource,
        scope: InstrumentationScope,
        on_drop: Callable[[int], None],
        sizes: tuple[int, int],
        delay_s: float,
    ) -> None:
        self._exporter, self._resource, self._scope, self._on_drop = exporter, resource, scope, on_drop
        self._head = scope_head(resource, scope)
        self._max_size, self._batch_size = sizes
        self._delay_s, self.records, self._stopped = delay_s, deque[Any](), False
        self.wake, self._lock = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._run, name="span-export", daemon=True)
        self._thread.start()

    def put(self, record: SpanRecord | ReadableSpan) -> None:
        queue = self.records
        if len(queue) >= self._max_size or self._stopped:
            self._on_drop(1)
            return
        queue.append(record)
        if len(queue) == self._batch_size:
            self.wake.set()

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.put(record_of(span) or span)

    def _run(self) -> None:
        while not self._stopped:
            self.wake.wait(self._delay_s)
            self.wake.clear()
            self._flush()

    def _flush(self) -> None:
        """Send everything queued now."""
        with self._lock:
            queue, size = self.records, self._batch_size
            while queue:
                batch = [queue.popleft() for _ in range(min(size, len(queue)))]
                try:
                    sent = self._exporter.export(self._encode(batch)) is SpanExportResult.SUCCESS  # type: ignore
                except Exception:  # an exporter's bug must not stop the thread
                    log.debug("span export failed", exc_info=True)
                    sent = False
                if not sent:
                    self._on_drop(len(batch))

    def _encode(self, batch: list[Any]) -> Encoded:
        records = [r for r in batch if r.__class__ is tuple]
        odd = [r for r in batch if r.__class__ is not tuple]  # the SDK's spans that are no records
        encoded = None if self._head is None else encode_records(records, self._head)
        if encoded is None:  # an attribute only the SDK writes: the records as its spans
            odd += [_readable(r, self._resource, self._scope) for r in records]
            encoded = b""
        return Encoded(encoded + (encode_spans(odd).SerializeToString() if odd else b""), len(batch))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._flush()
        return True

    def shutdown(self) -> None:
        """Send what is queued and stop (tracing.shutdown bounds the wait)."""
        self._stopped = True
        self.wake.set()
        self._thread.join()
        self._flush()
        self._exporter.shutdown()


def _readable(record: SpanRecord, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """A record as the SDK's finished span (for its encoder)."""
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    trace_id, span_id, parent, remote, name, kind, start, end, attributes, links, status = record
    flags = TraceFlags(TraceFlags.SAMPLED)
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, span_id, False, flags),
        parent=SpanContext(trace_id, parent, remote, flags) if parent else None,
        resource=resource,
        attributes=attributes,
        links=[Link(SpanContext(t, s, r, flags), a) for t, s, r, a in links],
        kind=SpanKind(kind - 1),
        instrumentation_scope=scope,
        status=Status(StatusCode(status[0]), status[1] or None) if status else Status(StatusCode.UNSET),
        start_time=start,
        end_time=end,
    )
