"""Peer HTTP layers for our REST app: uvicorn (httptools, ASGI) and granian (RSGI), behind HttpServer's interface.

Each adapter takes HttpServer's constructor arguments and offers `start(sock)`, `close(timeout_s)` and `.app`,
so `bench.sections.http_candidates` can swap one in for `serving`'s own server and change nothing else.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.http.shared import HttpLimits, RequestHandler


class UvicornLayer:
    """RestApp behind uvicorn (httptools parser, uvloop), through a minimal ASGI app."""

    def __init__(
        self, app: RequestHandler, limits: HttpLimits, metrics: Any = None, extra_headers: bytes = b""
    ) -> None:
        self.app, self.limits = app, limits
        self._task: asyncio.Task[None] | None = None

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        method = "GET" if scope["method"] == "HEAD" else scope["method"]
        status, body, content_type = await self.app.handle(method, scope["path"], b"".join(chunks))
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def start(self, sock: socket.socket) -> None:
        import uvicorn

        config = uvicorn.Config(
            self._asgi,
            http="httptools",
            interface="asgi3",
            loop="none",
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=int(self.limits.keepalive_timeout_s),
            limit_concurrency=self.limits.max_connections,
            h11_max_incomplete_event_size=self.limits.max_header_bytes,
        )
        self.server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self.server._serve(sockets=[sock]))

    async def close(self, timeout_s: float) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await asyncio.wait_for(self._task, timeout_s + 5)


class GranianLayer:
    """RestApp behind granian's embedded server (hyper, Rust), through the RSGI interface."""

    def __init__(
        self, app: RequestHandler, limits: HttpLimits, metrics: Any = None, extra_headers: bytes = b""
    ) -> None:
        self.app, self.limits = app, limits
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Any, protocol: Any) -> None:
        body = await protocol()
        method = "GET" if scope.method == "HEAD" else scope.method
        status, payload, content_type = await self.app.handle(method, scope.path, body)
        protocol.response_bytes(status, [("content-type", content_type.decode())], payload)

    async def start(self, sock: socket.socket) -> None:
        from granian.constants import HTTPModes
        from granian.http import HTTP1Settings
        from granian.server.embed import Server as GranianServer

        host, port = sock.getsockname()[:2]
        sock.close()  # granian binds the port itself
        self.server = GranianServer(
            self,
            address=host,
            port=port,
            http=HTTPModes.http1,
            websockets=False,
            log_enabled=False,
            backpressure=self.limits.max_connections,
            http1_settings=HTTP1Settings(
                header_read_timeout=int(self.limits.header_timeout_s * 1000),
                max_buffer_size=self.limits.max_header_bytes,
            ),
        )
        self._task = asyncio.get_running_loop().create_task(self.server.serve())

    async def close(self, timeout_s: float) -> None:
        self.server.stop()
        if self._task is not None:
            await asyncio.wait_for(self._task, timeout_s + 5)
