"""One unary call of any of the gRPC services: decode its bytes, run the servicer's method, map its errors.

A ServingError aborts the call with its gRPC code (serving/errors.py); any other exception is a bug, logged
with its traceback (rate-limited: a client can repeat it at will) and answered INTERNAL. Bytes that do not
parse are INVALID_ARGUMENT; when the cause is a string field that is not UTF-8, the message names the field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from ctr_contract.ratelog import RateLimitedLog
from serving.errors import ServingError

log = logging.getLogger(__name__)
limited = RateLimitedLog(log)


def unary(
    method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], request_class: Any
) -> grpc.RpcMethodHandler:
    """The handler of one unary RPC: `request_class` parsed from the call's bytes, then `method(request, context)`."""

    # The handler gets the raw bytes and decodes them itself: a deserializer that raises would make grpcio
    # answer UNKNOWN, while bytes that are not the request message are the client's error.
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = request_class.FromString(raw)
        except DecodeError as exc:
            field = invalid_utf8_field(request_class.DESCRIPTOR, raw)
            if field is not None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request's {field} is not valid UTF-8; send UTF-8 strings",
                )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot decode the request: {exc}")
        try:
            return await method(request, context)
        except ServingError as exc:
            await context.abort(exc.grpc_code, exc.message)
        except Exception as exc:  # a bug: log it (rate-limited: clients can repeat it), answer INTERNAL
            limited.log(
                logging.ERROR, method.__name__, "unhandled error in %s", method.__name__, exc_info=True
            )
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=None, response_serializer=lambda m: m.SerializeToString()
    )


def add_trailing(context: grpc.aio.ServicerContext, key: str, value: str) -> None:
    """Add one entry to the call's trailing metadata, keeping those set before (e.g. the traceparent)."""
    context.set_trailing_metadata((*(context.trailing_metadata() or ()), (key, value)))


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline in time.monotonic() seconds (the predictor's `deadline`); None when it has none."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def invalid_utf8_field(descriptor: Descriptor, data: bytes, path: str = "") -> str | None:
    """The path (e.g. `inputs[0].name`) of the first string field of `data` that is not UTF-8, by walking
    the wire format with the message's descriptor; None when there is none or the bytes are no message."""
    try:
        return _walk(descriptor, memoryview(data), path)
    except IndexError:  # truncated: not a message at all
        return None


def _walk(descriptor: Descriptor, data: memoryview, path: str) -> str | None:
    seen: dict[int, int] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire in (1, 5):  # fixed64, fixed32
            i += 8 if wire == 1 else 4
            continue
        if wire == 0:
            _, i = _varint(data, i)
            continue
        if wire != 2:  # groups: not in these protos
            return None
        length, i = _varint(data, i)
        chunk, i = data[i : i + length], i + length
        field = descriptor.fields_by_number.get(number)
        if field is None:
            continue
        index = seen[number] = seen.get(number, -1) + 1
        repeated = field.label == FieldDescriptor.LABEL_REPEATED
        name = f"{path}{field.name}" + (f"[{index}]" if repeated else "")
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                bytes(chunk).decode("utf-8")
            except UnicodeDecodeError:
                return name
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            found = _walk(field.message_type, chunk, name + ".")
            if found is not None:
                return found
    return None


def _varint(data: memoryview, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80 or shift > 63:
            return value, i
