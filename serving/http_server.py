"""A small HTTP/1.1 server on asyncio + httptools for the REST API: keep-alive, pipelining, 100-continue.

Why not uvicorn: its ASGI layer (scope dicts, receive/send coroutines, header validation) cost more CPU
than the whole predict path of this model. Here a request is parsed by httptools' C parser, handed to
`RestApp.handle(method, path, body)`, and answered with one `transport.write`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from serving.rest import JSON, RestApp, error_body

log = logging.getLogger(__name__)

KEEP_ALIVE_TIMEOUT_S = 75.0  # idle keep-alive connections are closed after this (load balancers use 60 s)
MAX_PIPELINED = 32  # complete requests queued on one connection before it stops reading
DISCARD_FACTOR = 4  # an oversized body is read and dropped up to 4x the limit, so the client sees the 413
MAX_URL_BYTES = 8192
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class _Request:
    __slots__ = ("body", "keep_alive", "method", "path", "too_large")

    def __init__(self, method: str, path: str, body: bytes, keep_alive: bool, too_large: int) -> None:
        self.method, self.path, self.body, self.keep_alive, self.too_large = (
            method,
            path,
            body,
            keep_alive,
            too_large,
        )


class HttpServer:
    """Owns the listening socket and the open connections; `close()` drains them."""

    def __init__(self, app: RestApp, max_body_bytes: int, extra_headers: bytes = b"") -> None:
        """`extra_headers`: raw CRLF-terminated `name: value` lines added to every response."""
        self.app, self.max_body_bytes, self.extra_headers = app, max_body_bytes, extra_headers
        self.connections: set[HttpConnection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._date = b""
        self._date_at = 0.0
        self._sweeper: asyncio.Task[None] | None = None

    def date_header(self) -> bytes:
        now = time.monotonic()
        if now - self._date_at >= 1.0:  # formatting the date once a second, not once a request
            self._date, self._date_at = formatdate(usegmt=True).encode(), now
        return self._date

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: HttpConnection(self), sock=sock, backlog=2048)
        self._sweeper = loop.create_task(self._close_idle_forever())

    async def _close_idle_forever(self) -> None:
        while True:
            await asyncio.sleep(5)
            deadline = time.monotonic() - KEEP_ALIVE_TIMEOUT_S
            for conn in [c for c in self.connections if c.idle_since is not None and c.idle_since < deadline]:
                conn.close()

    async def close(self, timeout_s: float) -> None:
        """Stop accepting, close idle connections, give busy ones `timeout_s` to answer, then close all."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + timeout_s
        while True:
            for conn in [c for c in self.connections if c.idle_since is not None]:
                conn.close()
            if not self.connections or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()


class HttpConnection(asyncio.Protocol):
    """One client connection: parse, queue (pipelining), answer in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server, self.app, self.limit = server, server.app, server.max_body_bytes
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Request] = deque()
        self.busy = False
        self.idle_since: float | None = time.monotonic()
        self._task: asyncio.Task[None] | None = None  # held so the running task is not garbage-collected
        self._url = b""
        self._body: list[bytes] = []
        self._size = 0

    # --- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply_and_close(400, b"protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._reply_and_close(400, f"malformed HTTP request: {exc}".encode())

    # --- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.idle_since = None
        self._url, self._body, self._size = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_URL_BYTES:
            self._reply_and_close(414, f"request URL is over {MAX_URL_BYTES} bytes".encode())

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"expect" and value.lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for this before big bodies

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size <= self.limit:
            self._body.append(body)
        elif self._size > self.limit * DISCARD_FACTOR:  # stop reading a body this far over the limit
            self._reply_and_close(
                413, f"request body is over the limit of {self.limit} (--max_body_bytes)".encode()
            )

    def on_message_complete(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        if "%" in path:
            path = unquote(path)
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = _Request(
            self.parser.get_method().decode(),
            path,
            body,
            self.parser.should_keep_alive(),
            self._size if self._size > self.limit else 0,
        )
        self.pending.append(request)
        if len(self.pending) >= MAX_PIPELINED and self.transport is not None:
            self.transport.pause_reading()
        if not self.busy:
            self.busy = True
            self._task = asyncio.get_running_loop().create_task(self._serve_pending())

    # --- answering -----------------------------------------------------------------------------
    async def _serve_pending(self) -> None:
        while self.pending and self.transport is not None:
            request = self.pending.popleft()
            if request.too_large:
                message = f"request body of {request.too_large} bytes is over the limit of {self.limit} (--max_body_bytes)"
                status, body, content_type = 413, error_body(message), JSON
            else:
                status, body, content_type = await self.app.handle(request.method, request.path, request.body)
            self._write(status, body, content_type, request.keep_alive)
            if not request.keep_alive:
                self.close()
                return
            if len(self.pending) < MAX_PIPELINED and self.transport is not None:
                self.transport.resume_reading()
        self.busy = False
        self.idle_since = time.monotonic()

    def _write(self, status: int, body: bytes, content_type: bytes, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # the client went away while we computed its answer
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\ndate: %s\r\n%s%s\r\n" % (
            status,
            _REASONS.get(status, b""),
            content_type,
            len(body),
            self.server.date_header(),
            self.server.extra_headers,
            b"" if keep_alive else b"connection: close\r\n",
        )
        self.transport.write(head + body)

    def _reply_and_close(self, status: int, body: bytes) -> None:
        self._write(
            status, body if body.startswith(b"{") else error_body(body.decode()), JSON, keep_alive=False
        )
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
