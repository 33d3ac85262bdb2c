"""How a REST connection ends: a final error answered in order, lingering after it, the sweep's deadlines,
close and abort; and the pausing of reads that bounds what one client holds.

The base of HttpConnection (serving/http/connection.py), which owns the state these read and set.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import httptools

from serving.errors import JSON, error_body
from serving.http.messages import PendingRequest, render
from serving.http.shared import ConnectionBudget, HttpLimits

MAX_PIPELINED = 32  # complete requests queued on one connection before it stops reading
DISCARD_FACTOR = 4  # after a final error, up to 4x --max_body_bytes is read and dropped so the client sees it
LINGER_S = 5.0  # and for at most this long
NEVER = float("inf")


class ConnectionEnd:
    """The ending half of a connection; HttpConnection sets every field below."""

    budget: ConnectionBudget
    limits: HttpLimits
    transport: asyncio.Transport | None
    parser: httptools.HttpRequestParser | None
    pending: deque[PendingRequest]
    pending_bytes: int
    deadline: float
    write_deadline: float
    _phase: str
    _in_message: bool
    _continue_owed: bool
    _reading_paused: bool
    _write_paused: bool
    _closing: bool
    _fail_fast: bool
    _discard_left: int
    _size: int
    _chunks: list[bytes]

    def _set_phase(self, phase: str, timeout_s: float) -> None:
        self._phase, self.deadline = phase, time.monotonic() + timeout_s

    def _serve_soon(self) -> None:
        """Answer what is pending (HttpConnection's: the queue of requests is its own)."""
        raise NotImplementedError

    def _final_error(self, status: int, message: str) -> bytes:
        """An error response after which the connection closes: `{"error": message}`, `connection: close`."""
        return render(
            status, error_body(message), JSON, False, self.budget.date_header(), self.budget.extra_headers
        )

    def _fail(self, status: int, message: str, kind: str) -> None:
        """Stop parsing; answer `status` after the answers already owed, then close. `kind`: refusal metric."""
        if kind:
            self.budget.refused(kind)
        self.parser = None
        self._in_message, self._continue_owed = False, False
        self.budget.drop_body(self._size)  # the partial body is dropped now: memory to hand back
        self._chunks, self._size = [], 0
        # Over the body budget the client is likely one of many holding bodies: drop it as soon as it
        # sends more, rather than reading megabytes only to discard them.
        self._fail_fast = kind == "buffered_bytes"
        self._discard_left = 0 if self._fail_fast else self.limits.max_body_bytes * DISCARD_FACTOR
        self.pending.append(PendingRequest("", "", b"", False, self._final_error(status, message)))
        self._set_phase("linger", self.limits.body_timeout_s)
        self._serve_soon()

    def _write_final(self, response: bytes) -> None:
        if self.transport is not None:
            self.transport.write(response)
            self._linger()

    def _linger(self) -> None:
        """After the last answer: half-close, keep dropping what the client sends for a while, then close.

        Closing with unread input makes the kernel send RST, which can destroy the answer before the client
        reads it (e.g. a 413 while the client is still sending its body).
        """
        self.parser, self._closing = None, True
        self._discard_left = 0 if self._fail_fast else self.limits.max_body_bytes * DISCARD_FACTOR
        self._set_phase("linger", LINGER_S)
        self._maybe_resume_reading()
        if self.transport is not None and self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused
            and self.transport is not None
            and not self._write_paused
            and len(self.pending) < MAX_PIPELINED
            and self.pending_bytes <= self.limits.max_body_bytes
        ):
            self._reading_paused = False
            self.transport.resume_reading()

    def expire(self) -> None:
        """Called by the server's sweep when a deadline has passed: count the timeout and drop the client."""
        now = time.monotonic()
        if self._write_paused:
            if self.write_deadline >= now:
                return  # not reading its answers: only the write deadline decides
            kind = "write"
        elif self._reading_paused and self._phase in ("header", "body"):
            # We stopped reading (its earlier requests are still being answered): not the client's delay.
            timeout = self.limits.header_timeout_s if self._phase == "header" else self.limits.body_timeout_s
            self.deadline = now + timeout
            return
        else:
            kind = self._phase
        if kind != "linger":
            self.budget.timed_out(kind)
        self.abort()

    def close(self) -> None:
        """Close after flushing what is buffered (the sweep aborts it if the client never reads)."""
        if self.transport is not None and not self.transport.is_closing():
            self._closing = True
            self.transport.close()
            self._set_phase("linger", self.limits.body_timeout_s)

    def abort(self) -> None:
        """Close now, dropping any unsent output."""
        if self.transport is not None:
            self.transport.abort()
