"""What travels on one connection: a parsed request waiting for its answer, a refusal, a rendered response.

`require_method` is the method check of every REST route (405 naming the method to use).
"""

from __future__ import annotations

from http import HTTPStatus

from serving.errors import MethodNotAllowed

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class PendingRequest:
    """A complete request queued on its connection until the answers before it are written."""

    __slots__ = ("body", "error", "header_length", "keep_alive", "method", "path", "request_id")

    def __init__(
        self,
        method: str,
        path: str,
        body: bytes | bytearray,
        keep_alive: bool,
        error: bytes = b"",
        request_id: str = "",
        header_length: int | None = None,
    ) -> None:
        self.method, self.path, self.body, self.keep_alive = method, path, body, keep_alive
        self.header_length = (
            header_length  # the v2 binary extension's JSON header length (serving/protocols/v2_rest.py)
        )
        self.error = error  # a final response the HTTP layer decided (e.g. a 431), already rendered
        self.request_id = (
            request_id  # the client's x-request-id, or a fresh one (serving/observability/request_log.py)
        )


def require_method(method: str, expected: str) -> None:
    """MethodNotAllowed (405) unless a route is called with the method it serves."""
    if method != expected:
        raise MethodNotAllowed(f"method {method} is not allowed here; use {expected}")


class Rejected(Exception):
    """Raised from a parser callback: answer `status` with `message`, count `kind`, close the connection."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def render(
    status: int,
    body: bytes,
    content_type: bytes,
    keep_alive: bool,
    date: bytes,
    extra_headers: bytes,
    head_only: bool = False,
    request_id: str = "",
) -> bytes:
    """One HTTP/1.1 response: status line, headers (`extra_headers` are raw CRLF-ended lines), then `body`.

    `content_type` may end with further CRLF-separated header lines (the v2 binary extension's header length).
    """
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\ndate: %s\r\n%s%s%s\r\n" % (
        status,
        _REASONS.get(status, b""),
        content_type,
        len(body),
        date,
        b"x-request-id: %s\r\n" % request_id.encode() if request_id else b"",
        extra_headers,
        b"" if keep_alive else b"connection: close\r\n",
    )
    return head if head_only else head + body
