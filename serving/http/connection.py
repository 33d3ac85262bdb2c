"""One HTTP/1.1 client connection: parse (httptools), queue (pipelining), answer in order, within limits.

Every phase of a connection has a deadline that the server's sweep enforces (serving/http/server.py):
    header     first byte of a request (or the connect) -> end of its headers     --header_timeout_seconds
    body       end of the headers -> end of the body                             --body_timeout_seconds
    (busy)     the request is the server's to answer: no HTTP deadline (--rest_api_timeout_in_ms applies)
    keepalive  idle between requests                                             --keepalive_timeout_seconds
    write      the client stopped reading: output over --max_output_bytes       --body_timeout_seconds
    linger     after a final error response, reading and dropping what the client still sends (bounded)
A request that breaks a limit gets its answer *in order*, after the answers of the requests before it, and
then the connection is closed; nothing a client sent before its mistake is dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import httptools

from serving.http.connection_end import MAX_PIPELINED, NEVER, ConnectionEnd
from serving.http.encoding import BodyInflater, compress, compressible, request_coding, response_coding
from serving.http.messages import CONTINUE, TIMEOUT, TRACEPARENT, PendingRequest, Rejected, render
from serving.http.shared import ConnectionBudget, RequestHandler
from serving.observability.request_log import http_request_id

MAX_URL_BYTES = 8192
# The request headers the server reads (every other is counted against --max_headers and dropped).
READ_HEADERS = frozenset(
    (
        b"content-length",
        b"expect",
        b"x-request-id",
        b"traceparent",
        b"x-request-timeout-ms",
        b"inference-header-content-length",
        b"content-encoding",
        b"accept-encoding",
    )
)
FAIR_SHARE_BYTES = 128 << 10  # a body up to this is read even when the server's body budget is spent


class HttpConnection(ConnectionEnd, asyncio.Protocol):
    """One client connection; `deadline`/`write_deadline` are read by the server's sweep.

    `budget` is all it shares with the other connections: it never touches the server itself. How it ends
    (a final error in order, lingering, the deadlines, close and abort): serving/http/connection_end.py.
    """

    def __init__(self, app: RequestHandler, budget: ConnectionBudget) -> None:
        self.app, self.budget, self.limits = app, budget, budget.limits
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[PendingRequest] = deque()
        self.pending_bytes, self.busy = 0, False
        self.deadline, self.write_deadline, self._phase = NEVER, NEVER, "header"
        self._task: asyncio.Task[None] | None = None  # held so the running task is not garbage-collected
        self._idle: asyncio.Future[None] | None = None  # what the task waits on between requests
        # Taken once, at connect: asyncio.get_running_loop() makes a getpid() system call every time.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_message = False
        self._header_left: int | None = self.limits.max_header_bytes  # None once the headers are complete
        self._tail = b""  # last bytes of the previous chunk, to find a header end split across chunks
        self._reading_paused = self._write_paused = self._eof = self._continue_owed = False
        self._closing = self._finished_in_chunk = self._fail_fast = False
        self._writable: asyncio.Future[None] | None = None
        self._discard_left = 0
        # The timeout of the phase the parser entered in the chunk being read (None: none): its deadline
        # is set once the chunk is parsed, one clock read however many phases a chunk holds.
        self._phase_s: float | None = None
        self._reset_request()

    def _reset_request(self) -> None:
        self._url, self._headers = b"", 0
        self._length: int | None = None
        self._expect = False
        self._request_id = self._traceparent = self._timeout = b""
        self._header_length: int | None = None
        self._chunks: list[bytes] = []
        self._size = 0  # body bytes held: decompressed, when the body has a Content-Encoding
        self._coding: str | None = None  # the request's Content-Encoding (serving/http/encoding.py)
        self._inflater: BodyInflater | None = None
        self._accept: str | None = None  # the coding its response may have (Accept-Encoding)

    def is_idle(self) -> bool:
        return not (self.busy or self.pending or self._in_message)

    # --- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        assert self.transport is not None
        self._loop = asyncio.get_running_loop()
        if not self.budget.admit(self):
            # Refused at once, never queued: the client can retry elsewhere (another worker or replica).
            message = f"too many open connections (--max_connections={self.limits.max_connections})"
            self.transport.write(self._final_error(503, message))
            self.transport.close()
            self.parser = None
            return
        self.transport.set_write_buffer_limits(high=self.limits.max_output_bytes)
        self._set_phase("header", self.limits.header_timeout_s)  # a connection that sends nothing is slow too

    def connection_lost(self, exc: Exception | None) -> None:
        # Break every reference cycle (the parser holds this protocol) so the memory goes now, not at the
        # next full GC, which is rare after gc.freeze().
        self.budget.leave(self, self.pending_bytes + self._size)
        self.pending_bytes = self._size = 0
        self.transport = self.parser = None
        self.pending.clear()
        self._chunks = []
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():  # the task waiting for a request ends
            idle.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # a final answer is queued or sent: drop what the client still sends
            self._discard_left -= len(data)
            if self._discard_left < 0:
                self.abort()
            return
        if self._header_left is not None and len(data) > self._header_left:
            window = self._tail + data[: self._header_left]
            if b"\r\n\r\n" not in window and b"\n\n" not in window:
                self._fail(
                    431,
                    f"request header section is over {self.limits.max_header_bytes} bytes",
                    "header_bytes",
                )
                return
        self._tail, self._finished_in_chunk = data[-3:], False
        try:
            self.parser.feed_data(data)
            if self._phase_s is not None:  # a phase began in this chunk: its deadline, read once for all
                self.deadline, self._phase_s = time.monotonic() + self._phase_s, None
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported", "")
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, Rejected):
                raise
            self._fail(exc.__context__.status, exc.__context__.message, exc.__context__.kind)
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}", "")
        else:
            # Bytes of a header section still in progress. When a request ended inside this chunk, the next
            # header section's share of it is not counted: the limit may be passed by less than one read.
            if self._header_left is not None and not self._finished_in_chunk:
                self._header_left -= len(data)

    def eof_received(self) -> bool | None:
        if self.busy or self.pending:
            self._eof = True  # the client half-closed after pipelining: answer everything, then close
            return True
        return None  # nothing owed: let the transport close

    def pause_writing(self) -> None:
        """The client is not reading: stop reading and serving it until its output buffer drains."""
        self._write_paused = True
        self.write_deadline = time.monotonic() + self.limits.body_timeout_s
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused, self.write_deadline = False, NEVER
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._maybe_resume_reading()

    # --- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_message = True
        self._reset_request()
        self._phase, self._phase_s = "header", self.limits.header_timeout_s

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_URL_BYTES:
            raise Rejected(414, f"request URL is over {MAX_URL_BYTES} bytes", "url_bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        if self._headers > self.limits.max_headers:
            raise Rejected(431, f"request has over {self.limits.max_headers} header lines", "header_count")
        name = name.lower()
        if name not in READ_HEADERS:  # Host, Content-Type, User-Agent...: nothing to keep
            return
        value = value.strip(b" \t")  # optional whitespace is no part of a value
        if name == b"content-length":
            self._length = int(value)  # llhttp has checked that it is one non-negative integer
        elif name == b"expect" and value.lower() == b"100-continue":
            self._expect = True
        elif name == b"x-request-id":
            self._request_id = value
        elif name == b"traceparent":
            self._traceparent = value
        elif name == b"x-request-timeout-ms":
            self._timeout = value  # checked by the predict routes (serving/http/messages.py request_deadline)
        elif name == b"inference-header-content-length":
            self._header_length = int(value) if value.isdigit() and len(value) < 19 else -1  # -1: a 400 later
        elif name == b"content-encoding":
            self._coding = request_coding(value)  # 415 for a coding we cannot decode
        elif name == b"accept-encoding":
            self._accept = response_coding(value)

    def on_headers_complete(self) -> None:
        self._header_left = None
        limit = self.limits.max_body_bytes
        if self._length is not None and self._length > limit:
            # Refused before reading a byte of it, and with no "100 Continue": the client need not send it.
            raise Rejected(
                413,
                f"request body of {self._length} bytes is over the limit of {limit} (--max_body_bytes)",
                "body_bytes",
            )
        if self._expect and self.transport is not None:
            if not (self.busy or self.pending):
                self.transport.write(CONTINUE)  # curl waits for this before sending a large body
            else:
                self._continue_owed = True  # after the answers before it, or it would come out of order
        if self._coding is not None:  # inflated as it arrives: the limit is on the decompressed size
            self._inflater = BodyInflater(self._coding, limit)
        self._phase, self._phase_s = "body", self.limits.body_timeout_s

    def on_body(self, chunk: bytes) -> None:
        # A compressed body is inflated as it arrives: a bomb is 413 once its output passes --max_body_bytes.
        for piece in (chunk,) if self._inflater is None else self._inflater.feed(chunk):
            self._hold(piece)

    def _hold(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.limits.max_body_bytes:  # chunked encoding: no Content-Length to check first
            raise Rejected(
                413,
                f"request body is over the limit of {self.limits.max_body_bytes} (--max_body_bytes)",
                "body_bytes",
            )
        if not self.budget.hold_body(len(chunk)) and self._size > FAIR_SHARE_BYTES:
            # Bodies held by all connections are bounded: past the budget only small ones are still read.
            raise Rejected(
                503,
                f"the server holds over {self.limits.max_buffered_bytes} bytes of request bodies "
                "(--max_buffered_bytes); retry later",
                "buffered_bytes",
            )
        # Joined once at the end: growing one buffer instead copies the body again at each realloc, which
        # with many large bodies arriving at once stalled the event loop.
        self._chunks.append(chunk)

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self._in_message, self._finished_in_chunk = False, True
        self._header_left = self.limits.max_header_bytes
        if self._inflater is not None:
            self._inflater.finish()  # 400 for a truncated stream
        path = self._url.split(b"?", 1)[0].decode("latin-1")  # raw: the router splits, then decodes
        request_id, predict_id = b"", None
        # The client's id, or one made when the request log reads ids (made as bytes, the log's sample drawn once).
        if self._request_id or self.limits.make_request_ids:
            request_id, predict_id = http_request_id(self._request_id, self.limits.request_log_rate)
        request = PendingRequest(
            self.parser.get_method().decode(),
            path,
            self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks),
            self.parser.should_keep_alive(),
            request_id=request_id,
            predict_id=predict_id,
            header_length=self._header_length,
            accept=self._accept if self._accept is not None and compressible(path) else None,
            traceparent=self._traceparent,
            timeout=(self._timeout, time.monotonic()) if self._timeout else None,
        )
        self._chunks, self._size, self._inflater = [], 0, None
        self.pending.append(request)
        self.pending_bytes += len(request.body)
        self._phase, self.deadline, self._phase_s = "busy", NEVER, None
        if len(self.pending) >= MAX_PIPELINED or self.pending_bytes > self.limits.max_body_bytes:
            self._pause_reading()  # bounds what one connection holds: 32 requests or one full body
        self._serve_soon()

    # --- answering -----------------------------------------------------------------------------
    def _serve_soon(self) -> None:
        if self.busy:
            return
        self.busy = True
        idle = self._idle
        if idle is not None:  # the connection's task waits for this request: wake it
            self._idle = None
            idle.set_result(None)
        else:
            assert self._loop is not None  # requests arrive only after connection_made
            self._task = self._loop.create_task(self._serve())

    async def _serve(self) -> None:
        """The connection's one task: answer what is pending, in order, then wait for the next request.
        Waking a waiting task costs half what a new task a request did; it ends with the connection."""
        while await self._serve_pending():
            assert self._loop is not None
            self._idle = self._loop.create_future()
            await self._idle  # set by _serve_soon (a request) or connection_lost
            if self.transport is None:
                return

    async def _serve_pending(self) -> bool:
        """Answer the pending requests; True while the connection may take more."""
        try:
            while self.pending and self.transport is not None:
                if self._write_paused:
                    assert self._loop is not None
                    self._writable = self._loop.create_future()
                    await self._writable
                    continue
                request = self.pending.popleft()
                self.pending_bytes -= len(request.body)
                self.budget.release_body(len(request.body))
                if request.error:
                    self._write_final(request.error)
                    return False
                head_only = request.method == "HEAD"
                method = "GET" if head_only else request.method  # HEAD: GET's headers, no body
                # Set only when sent, or to clear a previous request's on this task: most requests send
                # neither header, and a set copies the task's context.
                if request.traceparent or TRACEPARENT.get():
                    TRACEPARENT.set(request.traceparent)  # the router's span (tracing on) continues its trace
                if request.timeout is not None or TIMEOUT.get() is not None:
                    TIMEOUT.set(request.timeout)  # x-request-timeout-ms, from when the request was read
                status, body, content_type = await self.app.handle(
                    method, request.path, request.body, request.predict_id, request.header_length
                )
                self.budget.count_freed(len(request.body))
                if self.transport is None:
                    return False
                date, extra = self.budget.date_header(), self.budget.extra_headers
                if request.accept is not None and len(body) > self.limits.compress_min_bytes:
                    body = compress(body, request.accept)
                    extra += b"content-encoding: %s\r\nvary: accept-encoding\r\n" % request.accept.encode()
                self.transport.write(
                    render(
                        status,
                        body,
                        content_type,
                        request.keep_alive,
                        date,
                        extra,
                        head_only,
                        request.request_id,
                    )
                )
                if not request.keep_alive:
                    self._linger()
                    return False
                self._maybe_resume_reading()
                if self.pending:
                    await asyncio.sleep(0)  # a pipelining client takes turns with the others, not 32 at once
            if self._continue_owed and self._in_message and self.transport is not None:
                self.transport.write(CONTINUE)
            self._continue_owed = False
        finally:
            self.busy = False
        if self._closing:
            return False
        if self._eof:
            self.close()
            return False
        if not self._in_message and self.transport is not None:
            self._set_phase("keepalive", self.limits.keepalive_timeout_s)
        return self.transport is not None
