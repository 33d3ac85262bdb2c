"""The x-request-id of every answer, and the id a connection hands the app: the client's sane id always, a made
one only when the request log samples it (`sampled`), so an unsampled request carries no id past the HTTP layer.

A real HttpConnection on this event loop, a transport that keeps what is written, an app that keeps the ids it
is handed.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from serving.http.connection import HttpConnection
from serving.http.shared import ConnectionBudget, HttpLimits
from serving.observability.metrics import ServingMetrics
from serving.observability.request_log import sampled, server_made

RATE = 0.25
ANSWER_ID = re.compile(rb"\r\nx-request-id: ([^\r]*)\r\n")


class IdsApp:
    """Answers 200 to everything and keeps the request id it was handed for each request."""

    def __init__(self) -> None:
        self.handed: list[str | None] = []

    async def handle(
        self,
        method: str,
        path: str,
        body: bytes | bytearray,
        request_id: str | None = None,
        header_length: int | None = None,
    ) -> tuple[int, bytes, bytes]:
        self.handed.append(request_id)
        return 200, b"{}", b"application/json"


class KeptTransport:
    """What the connection writes, kept."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def exchange(limits: HttpLimits, sent_ids: list[bytes | None]) -> tuple[list[bytes | None], list[str | None]]:
    """One GET a sent id (None: no x-request-id header) on one connection; (each answer's x-request-id, None for
    none; the id the app was handed for each)."""

    async def run() -> tuple[list[bytes | None], list[str | None]]:
        app, transport = IdsApp(), KeptTransport()
        connection = HttpConnection(app, ConnectionBudget(limits, ServingMetrics()))  # type: ignore[arg-type]
        connection.connection_made(transport)  # type: ignore[arg-type]
        for n, sent in enumerate(sent_ids, 1):
            header = b"" if sent is None else b"x-request-id: %s\r\n" % sent
            connection.data_received(b"GET /healthz HTTP/1.1\r\nhost: x\r\n%s\r\n" % header)
            for _ in range(100):  # the connection's task answers within a few turns of the loop
                if len(transport.written) == n:
                    break
                await asyncio.sleep(0)
        answered = [ANSWER_ID.search(w) for w in transport.written]
        connection.connection_lost(None)
        return [m.group(1) if m else None for m in answered], app.handed

    return asyncio.run(run())


def test_made_ids_are_answered_always_and_handed_on_exactly_when_sampled() -> None:
    answered, handed = exchange(HttpLimits(make_request_ids=True, request_log_rate=RATE), [None] * 400)
    assert all(a is not None for a in answered) and len(set(answered)) == 400  # every answer, each its own
    made = [a.decode() for a in answered if a is not None]
    assert all(server_made(i) for i in made)
    assert handed == [i if sampled(i, RATE) else None for i in made]
    assert 60 < sum(h is not None for h in handed) < 140  # the hash spreads made ids evenly too


def test_the_client_sane_id_is_answered_and_handed_on_whatever_the_sample() -> None:
    sent = [b"req-%d" % i for i in range(40)]
    answered, handed = exchange(HttpLimits(make_request_ids=True, request_log_rate=RATE), [*sent])
    assert answered == sent and handed == [s.decode() for s in sent]


def test_an_insane_client_id_is_replaced_by_a_made_one() -> None:
    bad = [b"has space", b"x" * 129, b"caf\xc3\xa9", b"a,b"]
    answered, handed = exchange(HttpLimits(make_request_ids=True, request_log_rate=1.0), [*bad])
    assert all(a is not None and server_made(a.decode()) for a in answered)
    assert handed == [a.decode() for a in answered if a is not None]  # rate 1: every made id is sampled


def test_no_id_is_made_or_handed_on_when_nothing_reads_it() -> None:
    answered, handed = exchange(HttpLimits(make_request_ids=False, request_log_rate=0.0), [None, b"c-1"])
    assert answered == [None, b"c-1"] and handed == [None, "c-1"]  # the client's still goes to the split
