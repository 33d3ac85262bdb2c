"""OTLP's ExportTraceServiceRequest written straight to protobuf wire bytes, for the gRPC span exporter.

The SDK's encoder (opentelemetry-exporter-otlp-proto-common `encode_spans`) builds a message object per
span, attribute and link, and hashes the span's resource (a JSON dump of it) once per span; on the
exporter's thread that holds the GIL the event loop needs. This writes the same message from the spans'
fields; tests/serving/observability/test_serving_tracing.py checks it against `encode_spans` field for field. What it
does not write (events, array or mapping attribute values, spans of several resources or scopes) goes to
the SDK's encoder whole, so the answer is always the SDK's message.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

_KINDS = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}  # SpanKind -> OTLP's enum
HAS_IS_REMOTE, IS_REMOTE = 0x100, 0x200  # OTLP's SpanFlags masks
_pack_q, _pack_d, _pack_i = struct.Struct("<Q").pack, struct.Struct("<d").pack, struct.Struct("<I").pack


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


def _flags(context: SpanContext | None) -> bytes:
    return _pack_i(HAS_IS_REMOTE | (IS_REMOTE if context is not None and context.is_remote else 0))


def _trace_state(context: SpanContext) -> str:
    state = context.trace_state
    return ",".join(f"{k}={v}" for k, v in state.items()) if state else ""


def _span(span: ReadableSpan) -> bytes | None:
    """One Span message; None when it has what only the SDK's encoder writes."""
    attributes = _attributes(b"\x4a", span.attributes)
    if attributes is None or span.events:
        return None
    context, parent = span.context, span.parent
    assert context is not None and span.start_time is not None and span.end_time is not None
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    state = _trace_state(context)
    if state:
        parts.append(_field(b"\x1a", state.encode()))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts += (
        _field(b"\x2a", span.name.encode()),
        b"\x30" + bytes((_KINDS[span.kind.name],)),
        b"\x39" + _pack_q(span.start_time),
        b"\x41" + _pack_q(span.end_time),
        attributes,
    )
    for count, tag in ((span.dropped_attributes, b"\x50"), (span.dropped_links, b"\x70")):
        if count:
            parts.append(tag + _varint(count))
    for link in span.links:
        link_attributes = _attributes(b"\x22", link.attributes)
        if link_attributes is None:
            return None
        ids = b"\x0a\x10" + link.context.trace_id.to_bytes(16, "big")
        ids += b"\x12\x08" + link.context.span_id.to_bytes(8, "big")
        parts.append(_field(b"\x6a", ids + link_attributes + b"\x35" + _flags(link.context)))
    status = span.status
    code = _varint(status.status_code.value) if status.status_code.value else b""
    message = _field(b"\x12", status.description.encode()) if status.description else b""
    parts.append(_field(b"\x7a", message + (b"\x18" + code if code else b"")))
    parts.append(b"\x85\x01" + _flags(parent))
    return b"".join(parts)


def encode_request(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """The ExportTraceServiceRequest of `spans`: the message `encode_spans(spans)` gives."""
    if not spans:
        return encode_spans(spans)
    resource, scope = spans[0].resource, spans[0].instrumentation_scope
    encoded = []
    for span in spans:
        if span.resource is not resource or span.instrumentation_scope is not scope:
            return encode_spans(spans)
        one = _span(span)
        if one is None:
            return encode_spans(spans)
        encoded.append(_field(b"\x12", one))
    resource_attributes = _attributes(b"\x0a", resource.attributes)
    scope_fields = b""
    if scope is not None:
        scope_attributes = _attributes(b"\x1a", scope.attributes)
        if scope_attributes is None:
            return encode_spans(spans)
        scope_fields = _field(b"\x0a", scope.name.encode()) if scope.name else b""
        scope_fields += _field(b"\x12", scope.version.encode()) if scope.version else b""
        scope_fields += scope_attributes
    if resource_attributes is None:
        return encode_spans(spans)
    scope_spans = _field(b"\x0a", scope_fields) + b"".join(encoded)
    if scope is not None and scope.schema_url:
        scope_spans += _field(b"\x1a", scope.schema_url.encode())
    resource_spans = _field(b"\x0a", resource_attributes) + _field(b"\x12", scope_spans)
    if resource.schema_url:
        resource_spans += _field(b"\x1a", resource.schema_url.encode())
    return ExportTraceServiceRequest.FromString(_field(b"\x0a", resource_spans))
