"""Hostile HTTP clients against a REST port, from their own process: `python -m bench.http_attack --port N`.

What issue 13 found, all at once for `--seconds`:
    slow       100 clients that send a header line every 0.5 s and never finish (reconnecting when dropped)
    holders    40 clients that send the headers and all but one byte of an 8 MiB body, then wait
    nonreader  1 client that pipelines `GET /metrics` and never reads an answer
    pathological  8 MiB bodies of `[[],[],...]`, one after the other
Prints one JSON line: how many connections the server dropped, per kind, and what the pathological bodies got.
Used by tests/serving/http/test_serving_attack.py and bench/http_layer.py (which compares HTTP layers with it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

BODY_LIMIT = 8 << 20
SLOW_HEAD = b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
PATHOLOGICAL = b'{"instances": [' + b"[]," * (BODY_LIMIT // 3 - 10) + b"[]]}"


class Tally:
    def __init__(self) -> None:
        self.dropped = {"slow": 0, "holders": 0, "nonreader": 0}
        self.pathological: list[str] = []
        self.nonreader_sent = 0


async def _dropped(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True when the server closes (EOF or reset) within `timeout_s`."""
    try:
        await asyncio.wait_for(reader.read(65536), timeout_s)
        return True  # an answer (e.g. 408/503) or EOF: either way the server let go
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def slow_client(port: int, until: float, tally: Tally) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(SLOW_HEAD)
            while time.monotonic() < until:
                if await _dropped(reader, 0.5):
                    tally.dropped["slow"] += 1
                    break
                writer.write(b"X-Slow: 1\r\n")
            writer.close()
        except ConnectionError:
            await asyncio.sleep(0.1)


async def body_holder(port: int, until: float, tally: Tally) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = SLOW_HEAD + b"Content-Length: %d\r\n\r\n" % (BODY_LIMIT - 1)
        writer.write(head + b"0" * (BODY_LIMIT - 2))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        if await _dropped(reader, max(0.1, until - time.monotonic())):
            tally.dropped["holders"] += 1
        writer.close()
    except ConnectionError:
        tally.dropped["holders"] += 1


async def nonreader(port: int, until: float, tally: Tally) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 50
    try:
        while time.monotonic() < until:
            writer.write(request)
            await asyncio.wait_for(writer.drain(), max(0.1, until - time.monotonic()))
            tally.nonreader_sent += 50
    except (TimeoutError, ConnectionError):
        pass
    # It never reads: the server must drop it (or stop answering it) on its own.
    with contextlib.suppress(ConnectionError):
        while time.monotonic() < until:
            if writer.transport.is_closing():
                break
            await asyncio.sleep(0.2)
    if reader.at_eof() or writer.transport.is_closing():
        tally.dropped["nonreader"] += 1
    writer.close()


async def pathological(port: int, until: float, tally: Tally) -> None:
    request = b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(
        PATHOLOGICAL
    )
    while time.monotonic() < until and len(tally.pathological) < 3:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        writer.write(request + PATHOLOGICAL)
        try:
            status = await asyncio.wait_for(reader.readline(), max(0.1, until - time.monotonic()))
            if not status:  # EOF: the server dropped the connection (a timeout's abort) without answering
                tally.pathological.append("no answer (closed)")
            else:
                tally.pathological.append(f"{status.decode().strip()} in {time.monotonic() - started:.2f}s")
        except (TimeoutError, ConnectionError) as exc:
            tally.pathological.append(f"no answer ({type(exc).__name__})")
        writer.close()


KINDS = ("slow", "holders", "nonreader", "pathological")


async def attack(port: int, seconds: float, kinds: tuple[str, ...] = KINDS) -> Tally:
    tally = Tally()
    until = time.monotonic() + seconds
    tasks = [slow_client(port, until, tally) for _ in range(100 if "slow" in kinds else 0)]
    tasks += [body_holder(port, until, tally) for _ in range(40 if "holders" in kinds else 0)]
    tasks += [nonreader(port, until, tally)] if "nonreader" in kinds else []
    tasks += [pathological(port, until, tally)] if "pathological" in kinds else []
    await asyncio.gather(*tasks, return_exceptions=True)
    return tally


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
    args = p.parse_args()
    tally = asyncio.run(attack(args.port, args.seconds, tuple(args.kinds.split(","))))
    print(
        json.dumps(
            {
                "dropped": tally.dropped,
                "nonreader_requests_sent": tally.nonreader_sent,
                "pathological": tally.pathological,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
