"""The Python path of a single raw row, in process: the server's own objects behind fake connections.

    python -m bench.raw_served MODEL_BASE_PATH --in_process [--before CHECKOUT [--before_model PATH]]

A checkout's server (its `serve()`, its router, predictor, batcher and ONNX Runtime) runs in a child process of
its own, but no socket carries its requests: `connections` fake transports each send their next one-row
`POST /v1/models/ctr:predict` when the answer to the last one is written, `requests` requests a round. A
round's figure is the process's CPU time (every thread) over its requests. No kernel, no wrk: what is left is
the Python path, which the machine's noise moves far less than a wrk point, so a change of 0.5 µs shows. The
turn-4 layout (its config and server modules at the top of `serving`, no `app` room) is run too, for --before 3ae4d21.

This file runs as a script in the child (`python bench/guard/in_process.py ...`, the checkout first on
PYTHONPATH), so it imports nothing of bench.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROUND_PREFIX = "round-cpu-us "


def measure(
    checkout: Path, model: Path, rounds: int, requests: int, connections: int, flags: tuple[str, ...] = ()
) -> list[float]:
    """CPU µs a request of each of `rounds` rounds of `checkout`'s server on `model`, after a warm-up."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(checkout), os.environ.get("PYTHONPATH"))))
    )
    cmd = [sys.executable, __file__, str(checkout), str(model), str(rounds), str(requests), str(connections)]
    out = subprocess.run(
        [*cmd, *flags], cwd=checkout, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    found = [
        float(line[len(ROUND_PREFIX) :]) for line in out.stdout.splitlines() if line.startswith(ROUND_PREFIX)
    ]
    if out.returncode != 0 or len(found) != rounds:
        raise RuntimeError(f"in-process run of {checkout} failed ({out.returncode}): {out.stderr[-2000:]}")
    return found


class _Transport:
    """A connection's transport: each answer written sends the connection's next request, until the round's
    count is sent; a non-200 answer fails the round."""

    def __init__(self, connection: Any, state: dict[str, Any]) -> None:
        self.connection, self.state, self.closed = connection, state, False

    def write(self, data: bytes) -> None:
        state = self.state
        state["done"] += 1
        if not data.startswith(b"HTTP/1.1 200 "):
            state["failed"] = bytes(data[:300])
        if state["sent"] < state["n"]:
            state["sent"] += 1
            state["loop"].call_soon(self.connection.data_received, state["request"])
        elif state["done"] >= state["n"] and not state["finished"].done():
            state["finished"].set_result(None)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def _round(server: Any, request: bytes, n: int, connections: int) -> float:
    from serving.http.connection import HttpConnection

    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {"n": n, "sent": 0, "done": 0, "failed": None, "loop": loop, "request": request}
    state["finished"] = loop.create_future()
    opened = []
    for _ in range(connections):
        connection = HttpConnection(server.app, server.budget)
        connection.connection_made(_Transport(connection, state))  # type: ignore[arg-type]
        opened.append(connection)
    started = time.process_time()
    for connection in opened:
        state["sent"] += 1
        connection.data_received(request)
    await state["finished"]
    cpu = time.process_time() - started
    for connection in opened:
        connection.connection_lost(None)
    if state["failed"]:
        raise RuntimeError(f"an answer was not 200: {state['failed']!r}")
    return cpu / n * 1e6


async def _child(
    checkout: Path, model: Path, rounds: int, n: int, connections: int, flags: list[str]
) -> None:
    import serving.http.server as http_server

    app = "serving.app." if (checkout / "serving" / "app").exists() else "serving."
    config, server_module = importlib.import_module(app + "config"), importlib.import_module(app + "server")
    row = importlib.import_module(app + "curl_example").CRITEO_ROW
    body = json.dumps({"instances": [{**row, "I1": 1}]}).encode()
    request = (
        b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    servers: list[Any] = []
    start = http_server.HttpServer.start

    async def keep(self: Any, sock: Any, tls: Any = None) -> None:  # the server's HTTP layer, kept
        servers.append(self)
        await start(self, sock, tls)

    http_server.HttpServer.start = keep  # type: ignore[method-assign]
    cfg = config.parse_config(
        [
            *("--host=127.0.0.1", "--port=0", f"--rest_api_port={_free_port()}", "--model_name=ctr"),
            *(f"--model_base_path={model}", "--intra_op_threads=1", "--log_level=warning"),
            *("--enable_batching=true", *flags),
        ]
    )
    asyncio.get_running_loop().create_task(server_module.serve(cfg))
    while not servers:
        await asyncio.sleep(0.05)
    for _ in range(1200):  # until the version is loaded
        if (await servers[0].app.handle("GET", "/v1/models/ctr", b""))[0] == 200:
            break
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError(f"no version of {model} was loaded within 120 s")
    await _round(servers[0], request, 5000, connections)  # warm-up
    for _ in range(rounds):
        print(f"{ROUND_PREFIX}{await _round(servers[0], request, n, connections):.3f}", flush=True)
    _exit(0)  # at once, the server serving: its shutdown is not what is measured


def _free_port() -> int:
    """A port of 127.0.0.1 free now: the server binds its REST port, which no request ever reaches."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _main(argv: list[str]) -> None:
    import traceback

    import uvloop

    checkout, model, rounds, n, connections, *flags = argv
    uvloop.install()
    try:
        asyncio.run(_child(Path(checkout), Path(model), int(rounds), int(n), int(connections), flags))
    except BaseException:
        traceback.print_exc()
    _exit(1)


def _exit(code: int) -> None:
    """Exit now: the large-body decoder's process killed, the server's threads not waited for."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _main(sys.argv[1:])
