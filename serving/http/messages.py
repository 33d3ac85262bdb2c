"""What travels on one connection: a parsed request waiting for its answer, a refusal, a rendered response.

`RequestPath` is a request's path as routes see it: split at `/` on the raw path, then each segment decoded, so
`%2F` stays inside a segment (a name) and can never walk into another route. `require_method` is the method
check of every REST route (405 naming the method to use, with `Allow`); `answer_headers` the headers that say
which version answered a predict.
"""

from __future__ import annotations

from contextvars import ContextVar
from functools import lru_cache
from http import HTTPStatus
from urllib.parse import unquote_to_bytes

from serving.errors import InvalidArgument, MethodNotAllowed

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# The `traceparent` header of the request being answered, set by the connection before the router runs
# (read only while tracing is on: serving/observability/tracing.py).
TRACEPARENT: ContextVar[bytes] = ContextVar("traceparent", default=b"")
# The request's `x-request-timeout-ms` as sent and the time.monotonic() it was read at (None: no header),
# set likewise; the predict routes turn it into the predictor's deadline (`request_deadline`).
TIMEOUT: ContextVar[tuple[bytes, float] | None] = ContextVar("timeout", default=None)
MAX_TIMEOUT_MS = 24 * 3600 * 1000  # a day: a longer x-request-timeout-ms is a mistake, not a deadline
# Parsed paths kept (a server sees few distinct ones; each key is at most MAX_URL_BYTES, so the cache stays
# within a few MB whatever clients send).
PATHS_CACHED = 256


class PendingRequest:
    """A complete request queued on its connection until the answers before it are written."""

    __slots__ = (
        "accept",
        "body",
        "error",
        "header_length",
        "keep_alive",
        "method",
        "path",
        "predict_id",
        "request_id",
        "timeout",
        "traceparent",
    )

    def __init__(
        self,
        method: str,
        path: str,
        body: bytes | bytearray,
        keep_alive: bool,
        error: bytes = b"",
        request_id: bytes = b"",
        predict_id: str | None = None,
        header_length: int | None = None,
        accept: str | None = None,
        traceparent: bytes = b"",
        timeout: tuple[bytes, float] | None = None,
    ) -> None:
        self.method, self.path, self.body, self.keep_alive = method, path, body, keep_alive
        self.accept = accept  # the response's coding when its body is large enough (gzip, deflate), or None
        self.header_length = (
            header_length  # the v2 binary extension's JSON header length (serving/protocols/v2_rest.py)
        )
        self.traceparent = traceparent  # W3C trace context header, as sent (b"": none)
        self.timeout = timeout  # (x-request-timeout-ms as sent, time.monotonic() when read), or None
        self.error = error  # a final response the HTTP layer decided (e.g. a 431), already rendered
        # The x-request-id the answer carries: the client's, or one the server made (b"": none, when nothing reads
        # it, HttpLimits.make_request_ids); and the id the app is handed, for the traffic split and the request
        # log: the client's, or a made one the log samples (None: neither reads it). See
        # serving/observability/request_log.py `http_request_id`.
        self.request_id, self.predict_id = request_id, predict_id


def request_deadline() -> float | None:
    """The answered request's deadline from its `x-request-timeout-ms` (time.monotonic() seconds; None: no
    header), counted from when the request was read; InvalidArgument (400) for a value that is not a whole
    number of milliseconds from 1 to MAX_TIMEOUT_MS."""
    timeout = TIMEOUT.get()
    if timeout is None:
        return None
    value, received = timeout
    ms = int(value) if value.isdigit() and len(value) < 12 else 0
    if not 1 <= ms <= MAX_TIMEOUT_MS:
        shown = value[:40].decode("latin-1")
        raise InvalidArgument(
            f"x-request-timeout-ms must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}, got {shown!r}"
        )
    return received + ms / 1e3


def answer_headers(version: int, fallback: str | None) -> bytes:
    """The header lines a predict answer adds after its content type: `x-model-version: <the version that
    answered>`, and `x-ctr-fallback: <reason>` when a fallback version answered (each line CRLF-led)."""
    if fallback is None:
        return b"\r\nx-model-version: %d" % version
    return b"\r\nx-model-version: %d\r\nx-ctr-fallback: %s" % (version, fallback.encode("latin-1"))


def require_method(method: str, expected: str) -> None:
    """MethodNotAllowed (405, `Allow` naming `expected`) unless a route is called with the method it serves.

    A GET route also takes HEAD (the HTTP layer answers it with GET's headers).
    """
    if method != expected:
        allow = "GET, HEAD" if expected == "GET" else expected
        raise MethodNotAllowed(f"method {method} is not allowed here; use {expected}", allow)


def _decode_segment(raw: str) -> str:
    """One raw segment (the URL's bytes as latin-1) percent-decoded as UTF-8 (an invalid sequence: U+FFFD)."""
    if raw.isascii() and "%" not in raw:
        return raw
    return unquote_to_bytes(raw.encode("latin-1")).decode("utf-8", "replace")


@lru_cache(maxsize=PATHS_CACHED)
def path_segments(raw: str) -> tuple[str, ...]:
    """A raw path split at `/`, then each segment decoded (cached: the same few paths come again and again)."""
    return tuple(_decode_segment(s) for s in raw.split("/")[1:]) if raw.startswith("/") else ()


class RequestPath:
    """A request path: `raw` as sent (without the query), `segments` split at `/` first, then each decoded.

    `/v2/models/ctr%2Fready` is ("v2", "models", "ctr/ready"): one segment, a model name no model has.
    """

    __slots__ = ("raw", "segments")

    def __init__(self, raw: str) -> None:
        """`raw`: the path's bytes decoded as latin-1 (one char a byte), percent-escapes untouched."""
        self.raw = raw
        self.segments = path_segments(raw)

    def __str__(self) -> str:
        return self.raw

    def split_verb(self) -> tuple[tuple[str, ...], str | None]:
        """(segments, verb) with the raw last segment's `:verb` split off (TF Serving's `:predict`).

        Only a raw `:` separates a verb: `ctr%3Apredict` is the name `ctr:predict`, with no verb.
        """
        _, sep, last = self.raw.rpartition("/")
        if ":" not in last or not sep:
            return self.segments, None
        last, verb = last.rsplit(":", 1)
        return (*self.segments[:-1], _decode_segment(last)), verb


def model_route(
    segments: tuple[str, ...], prefix: tuple[str, ...], labels: bool = False
) -> tuple[str, str | None, str | None, tuple[str, ...]] | None:
    """`prefix/{name}[/versions/{v}|/labels/{l}]/rest...` -> (name, version, label, rest); None if not one.

    `labels`: the route takes `/labels/{l}` (TF Serving's v1). Names, versions and labels are decoded
    segments and never empty.
    """
    n = len(prefix)
    if len(segments) <= n or segments[:n] != prefix or not segments[n]:
        return None
    name, rest = segments[n], segments[n + 1 :]
    version = label = None
    if len(rest) >= 2 and (rest[0] == "versions" or (labels and rest[0] == "labels")):
        if not rest[1]:
            return None
        version, label = (rest[1], None) if rest[0] == "versions" else (None, rest[1])
        rest = rest[2:]
    return name, version, label, rest


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
    request_id: bytes = b"",
) -> bytes:
    """One HTTP/1.1 response: status line, headers (`extra_headers` are raw CRLF-ended lines), then `body`.

    `content_type` may end with further CRLF-separated header lines (the v2 binary extension's header length).
    `request_id`: the `x-request-id` to answer (b"": none).
    """
    head = (_HEAD_WITH_ID if request_id else _HEAD) % (
        status,
        _REASONS.get(status, b""),
        content_type,
        len(body),
        date,
        request_id,
        extra_headers,
        b"" if keep_alive else b"connection: close\r\n",
    )
    return head if head_only else head + body


# A response's head, with and without an x-request-id line (one formatting either way; `%.0s` takes the empty id).
_HEAD = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\ndate: %s\r\n%.0s%s%s\r\n"
_HEAD_WITH_ID = (
    b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\ndate: %s\r\nx-request-id: %s\r\n%s%s\r\n"
)
