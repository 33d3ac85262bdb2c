"""A small HTTP/1.1 server on asyncio + httptools for the REST API, hardened against slow and hostile clients.

Why not uvicorn or granian: bench/http_layer.py ran all three with the same app under load and under attack
(docs/serving-http.md). Only this one dropped slow clients, body holders and non-readers and gave the memory
back: uvicorn has no header or body read timeout, granian no body read timeout and no output limit.

Here a request is parsed by httptools' C parser, handed to the router's `handle(method, path, body)`
(serving/protocols/router.py), and answered with one `transport.write`. serving/http/connection.py is one connection and serving/http/shared.py what the
connections share; this module owns the listening socket, the timeouts (one sweep a `SWEEP_S`, not a timer
per request) and memory hand-back.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time

from serving.http.connection import HttpConnection
from serving.http.memory import install_report_signal
from serving.http.shared import ConnectionBudget, HttpLimits, RequestHandler
from serving.observability.metrics import ServingMetrics
from serving.observability.process import release_freed_memory

__all__ = ["HttpLimits", "HttpServer"]

log = logging.getLogger(__name__)

SWEEP_S = 0.25  # how often deadlines are checked: a timeout fires at most this late
TRIM_AFTER_BYTES = 16 << 20  # hand freed memory back to the OS once this much request data was dropped
TRIM_QUIET_S = 1.0  # or once any was and no large body was dropped for this long (the end of a burst)


class HttpServer:
    """Owns the listening socket and the open connections; `close()` drains them."""

    def __init__(
        self,
        app: RequestHandler,
        limits: HttpLimits,
        metrics: ServingMetrics | None = None,
        extra_headers: bytes = b"",
    ) -> None:
        """`extra_headers`: raw CRLF-terminated `name: value` lines added to every response."""
        self.app, self.limits = app, limits
        self.budget = ConnectionBudget(limits, metrics or ServingMetrics(), extra_headers)
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._trimming = False

    async def start(self, sock: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        """Serve `sock`; `tls`: HTTPS only (serving/app/tls.py), the handshake bounded like a header section."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self.app, self.budget),
            sock=sock,
            backlog=2048,
            ssl=tls,
            ssl_handshake_timeout=self.budget.limits.header_timeout_s if tls is not None else None,
        )
        self._sweeper = loop.create_task(self._sweep_forever())
        install_report_signal(loop.add_signal_handler)  # CTR_SERVING_MEMORY_REPORT: off unless set

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for conn in [c for c in self.budget.open if c.deadline < now or c.write_deadline < now]:
                conn.expire()
            if not self._trimming and self.budget.take_freed(TRIM_AFTER_BYTES, TRIM_QUIET_S):
                # glibc keeps freed heap pages; malloc_trim gives them back (in a thread: it walks the heap).
                self._trimming = True
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
            for conn in [c for c in self.budget.open if c.is_idle()]:
                conn.close()
            if not self.budget.open or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.budget.open):
            conn.abort()
