"""What every REST connection of one worker shares: the limits, the connection and body-byte budget, counters.

A connection (serving/http/connection.py) changes shared state only through ConnectionBudget's methods; the
server (serving/http/server.py) owns the budget, sweeps its open connections and hands freed memory back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from email.utils import formatdate
from typing import Protocol

from serving.observability.metrics import ServingMetrics

# Responses over this are compressed when the client accepts it (--response_compression_min_bytes): below it
# gzip costs more CPU than the bytes it saves take on a 1 Gbit/s link, and the answer fits one TCP segment
# anyway (docs/perf/serving-compression.md).
COMPRESS_MIN_BYTES = 1400
LARGE_BODY_BYTES = 64 << 10  # dropping a body this large counts towards handing memory back (malloc_trim)


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold: time, header size, body size, output buffer; and the connections per worker."""

    max_body_bytes: int = 8 << 20
    header_timeout_s: float = 10.0  # from the first byte of a request to the end of its headers
    body_timeout_s: float = 30.0  # from the end of the headers to the end of the body; also the send timeout
    keepalive_timeout_s: float = 75.0  # idle between requests (load balancers use 60 s, so keep it above)
    max_header_bytes: int = 64 << 10  # request line + header section; over it: 431 and close
    max_headers: int = 200  # header lines; over it: 431 and close
    max_connections: int = 1024  # per worker; new connections beyond it get 503 and are closed at once
    max_output_bytes: int = 1 << 20  # unsent response bytes: over it, stop reading and serving that client
    max_buffered_bytes: int = 64 << 20  # request bodies held by all connections of this worker
    compress_min_bytes: int = (
        COMPRESS_MIN_BYTES  # larger responses are compressed for a client that accepts it
    )
    # Whether a request without a usable x-request-id gets one the server makes (and answers in x-request-id):
    # only something that reads it needs one, the request log (serving/observability/request_log.py).
    make_request_ids: bool = True
    # The request log's sample rate: a made id is handed to the app only when the log samples it (decided where
    # it is made, serving/observability/request_log.py `http_request_id`); 1.0 hands every one on.
    request_log_rate: float = 1.0


class RequestHandler(Protocol):
    """The application behind the HTTP layer (serving/protocols/router.py's RestRouter)."""

    async def handle(
        self,
        method: str,
        path: str,
        body: bytes | bytearray,
        request_id: str | None = None,
        header_length: int | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Answer one request: (status, body, content type); never raises. `path`: raw, as sent.

        `header_length`: the v2 binary extension's Inference-Header-Content-Length, when sent.
        """
        ...


class OpenConnection(Protocol):
    """What the server's sweep and shutdown need of an open connection (serving/http/connection.py)."""

    deadline: float
    write_deadline: float

    def is_idle(self) -> bool: ...
    def expire(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


class ConnectionBudget:
    """The open connections of one worker and the request-body bytes they hold, within `limits`."""

    def __init__(self, limits: HttpLimits, metrics: ServingMetrics, extra_headers: bytes = b"") -> None:
        """`extra_headers`: raw CRLF-terminated `name: value` lines added to every response."""
        self.limits, self.metrics, self.extra_headers = limits, metrics, extra_headers
        self.open: set[OpenConnection] = set()
        self.buffered_bytes = 0  # request body bytes held by all connections now
        self.freed_bytes = 0  # large request bodies dropped since the last memory hand-back
        self.freed_at = 0.0  # when the last one was dropped (time.monotonic)
        self._date = b""
        self._date_at = 0.0
        metrics.open_connections.track(lambda: float(len(self.open)))

    def admit(self, connection: OpenConnection) -> bool:
        """Count `connection` as open; False (and a refusal counted) when --max_connections are open."""
        if len(self.open) >= self.limits.max_connections:
            self.refused("connections")
            return False
        self.open.add(connection)
        return True

    def leave(self, connection: OpenConnection, held_bytes: int) -> None:
        """`connection` closed while holding `held_bytes` of request bodies: give them back."""
        self.open.discard(connection)
        self.release_body(held_bytes)
        self.count_freed(held_bytes)

    def hold_body(self, n: int) -> bool:
        """`n` more body bytes are held; True while all connections together stay within --max_buffered_bytes."""
        self.buffered_bytes += n
        return self.buffered_bytes <= self.limits.max_buffered_bytes

    def release_body(self, n: int) -> None:
        """`n` body bytes are no longer held by a connection (handed to the app, or dropped)."""
        self.buffered_bytes -= n

    def drop_body(self, n: int) -> None:
        """A connection dropped `n` body bytes it held (a refused body): no longer held, and freed."""
        self.release_body(n)
        self.count_freed(n)

    def count_freed(self, n: int) -> None:
        """A body of `n` bytes was freed: a large one counts towards handing memory back to the OS."""
        if n >= LARGE_BODY_BYTES:
            self.freed_bytes += n
            self.freed_at = time.monotonic()

    def take_freed(self, at_least: int, quiet_s: float) -> bool:
        """True (and the count restarts) once `at_least` bytes of large bodies were dropped, or any were and
        none for `quiet_s` since: the end of a burst is handed back too, not only each `at_least` of it."""
        if self.freed_bytes == 0:
            return False
        if self.freed_bytes < at_least and time.monotonic() - self.freed_at < quiet_s:
            return False
        self.freed_bytes = 0
        return True

    def refused(self, kind: str) -> None:
        """Count a request or connection refused for the limit `kind`."""
        self.metrics.requests_refused.inc(kind)

    def timed_out(self, kind: str) -> None:
        """Count a connection closed for the timeout `kind` (header, body, keepalive, write)."""
        self.metrics.connection_timeouts.inc(kind)

    def date_header(self) -> bytes:
        """The `date` header's value, formatted once a second rather than once a request."""
        now = time.monotonic()
        if now - self._date_at >= 1.0:
            self._date, self._date_at = formatdate(usegmt=True).encode(), now
        return self._date
