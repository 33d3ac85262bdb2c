"""A small HTTP/1.1 server on asyncio + httptools for the REST API, hardened against slow and hostile clients.

Why not uvicorn or granian: bench/http_layer.py ran all three with the same app under load and under attack
(docs/serving-http.md). Only this one dropped slow clients, body holders and non-readers and gave the memory
back: uvicorn has no header or body read timeout, granian no body read timeout and no output limit.

Here a request is parsed by httptools' C parser, handed to `RestApp.handle(method, path, body)`, and answered
with one `transport.write`. serving/http_connection.py is one connection; this module owns the listening
socket, the limits, the timeouts (one sweep a `SWEEP_S`, not a timer per request) and memory hand-back.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from email.utils import formatdate

from serving.http_connection import HttpConnection
from serving.memory import release_freed_memory
from serving.metrics import ServingMetrics
from serving.rest import RestApp

log = logging.getLogger(__name__)

SWEEP_S = 0.25  # how often deadlines are checked: a timeout fires at most this late
TRIM_AFTER_BYTES = 16 << 20  # hand freed memory back to the OS once this much request data was dropped


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


class HttpServer:
    """Owns the listening socket and the open connections; `close()` drains them."""

    def __init__(
        self,
        app: RestApp,
        limits: HttpLimits,
        metrics: ServingMetrics | None = None,
        extra_headers: bytes = b"",
    ) -> None:
        """`extra_headers`: raw CRLF-terminated `name: value` lines added to every response."""
        self.app, self.limits, self.extra_headers = app, limits, extra_headers
        self.metrics = metrics or ServingMetrics()
        self.connections: set[HttpConnection] = set()
        self.metrics.open_connections.track(lambda: float(len(self.connections)))
        self.freed_bytes = 0  # request bytes dropped since the last trim
        self.buffered_bytes = 0  # request body bytes held by all connections now
        self._server: asyncio.base_events.Server | None = None
        self._date = b""
        self._date_at = 0.0
        self._sweeper: asyncio.Task[None] | None = None
        self._trimming = False

    def date_header(self) -> bytes:
        now = time.monotonic()
        if now - self._date_at >= 1.0:  # formatting the date once a second, not once a request
            self._date, self._date_at = formatdate(usegmt=True).encode(), now
        return self._date

    def refused(self, kind: str) -> None:
        """Count a request or connection refused for the limit `kind`."""
        self.metrics.requests_refused.inc(kind)

    def timed_out(self, kind: str) -> None:
        """Count a connection closed for the timeout `kind` (header, body, keepalive, write)."""
        self.metrics.connection_timeouts.inc(kind)

    async def start(self, sock: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        """Serve `sock`; `tls`: HTTPS only (serving/tls.py), the handshake bounded like a header section."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self),
            sock=sock,
            backlog=2048,
            ssl=tls,
            ssl_handshake_timeout=self.limits.header_timeout_s if tls is not None else None,
        )
        self._sweeper = loop.create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for conn in [c for c in self.connections if c.deadline < now or c.write_deadline < now]:
                conn.expire()
            if self.freed_bytes >= TRIM_AFTER_BYTES and not self._trimming:
                # glibc keeps freed heap pages; malloc_trim gives them back (in a thread: it walks the heap).
                self.freed_bytes, self._trimming = 0, True
                try:
                    await loop.run_in_executor(None, release_freed_memory)
                finally:
                    self._trimming = False

    async def close(self, timeout_s: float) -> None:
        """Stop accepting, close idle connections, give busy ones `timeout_s` to answer, then close all."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + timeout_s
        while True:
            for conn in [c for c in self.connections if c.is_idle()]:
                conn.close()
            if not self.connections or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.abort()
