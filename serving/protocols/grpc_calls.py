"""One unary call of any of the gRPC services: decode its bytes, run the servicer's method, map its errors.

A ServingError aborts the call with its gRPC code (serving/errors.py); any other exception is a bug, logged
with its traceback (rate-limited: a client can repeat it at will) and answered INTERNAL.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
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
