"""Which HTTP layer should serve REST? Ours (serving/http_server.py) vs uvicorn+httptools vs granian (RSGI).

Same app logic for all: each candidate is `python -m serving` with only `serving.server.HttpServer` swapped
for an adapter, so model loading, RestApp, the predictor, gRPC and the metrics are the very same code.
In one run, on one machine, interleaved:
    load    wrk POSTing one instance at 1, 8 and 64 connections: QPS and p99
    attack  bench/http_attack.py (100 slow clients, 40 body holders, a non-reader, pathological bodies) for
            ATTACK_S while one keep-alive client predicts: its p99, what the server dropped, and its RSS
            before, during and after
Every layer gets the limits it has: ours all of them; uvicorn its keep-alive timeout, connection cap
(limit_concurrency) and incomplete-event cap; granian its header read timeout, buffer cap and backpressure.

    python -m bench.http_layer --model_base_path artifacts/models/ctr [--seconds 5] [--rounds 2]
    python -m bench.http_layer --model_base_path artifacts/models/ctr --memory
        how RSS comes back after 3 rounds of 40 body holders, for each way of handing memory back
    python -m bench.http_layer --serve uvicorn -- <python -m serving flags>    (one candidate; used by the above)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import procs
from bench.serving_load import Server, free_port, measure, write_lua
from serving.http_server import HttpLimits
from serving.rest import RestApp

LAYERS = ("ours", "uvicorn+httptools", "granian rsgi")
# Our server with some of serving/memory.py switched off: which part brings the RSS back?
MEMORY_VARIANTS = ("neither", "malloc_trim (shipped)", "mmap threshold 1 MiB", "both")
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # glibc: fixed, so large frees no longer raise it
CONNECTIONS = (1, 8, 64)
ATTACK_S = 8.0
LIMIT_FLAGS = ["--header_timeout_seconds=2", "--body_timeout_seconds=2", "--keepalive_timeout_seconds=5"]
BODY = json.dumps({"instances": [[0.25] * 128]}).encode()
REQUEST = b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


# --- the candidates' adapters: HttpServer's interface (start(sock), close(timeout_s), .app) ---------
class UvicornLayer:
    """RestApp behind uvicorn (httptools parser, uvloop), through a minimal ASGI app."""

    def __init__(
        self, app: RestApp, limits: HttpLimits, metrics: Any = None, extra_headers: bytes = b""
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
        self, app: RestApp, limits: HttpLimits, metrics: Any = None, extra_headers: bytes = b""
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


def serve_with(layer: str, flags: list[str]) -> None:
    """Run `python -m serving flags` with the HTTP layer `layer` (in this process)."""
    import serving.http_server
    import serving.server
    from serving.__main__ import main

    if layer in ("neither", "mmap threshold 1 MiB"):
        serving.http_server.release_freed_memory = lambda: None  # type: ignore[assignment]
    if layer == "uvicorn+httptools":
        serving.server.HttpServer = UvicornLayer  # type: ignore[misc,assignment]
    elif layer == "granian rsgi":
        serving.server.HttpServer = GranianLayer  # type: ignore[misc,assignment]
    main(flags)


# --- the measurement ---------------------------------------------------------------------------------
def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _normal_client(port: int, seconds: float, latencies: list[float], failures: list[str]) -> None:
    """Sequential predicts on one keep-alive connection; reconnects if the server drops it."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while time.monotonic() < until:
                    started = time.perf_counter()
                    sock.sendall(REQUEST)
                    received = b""
                    while not received.endswith(b"]]}"):
                        chunk = sock.recv(65536)
                        if not chunk:
                            raise ConnectionError("closed by the server")
                        received += chunk
                    latencies.append(time.perf_counter() - started)
                    time.sleep(0.01)
        except (OSError, ConnectionError) as exc:
            failures.append(type(exc).__name__)
            time.sleep(0.05)


def attack(server: Server) -> dict[str, Any]:
    """The attack of bench/http_attack.py against `server`, with a normal client measuring meanwhile."""
    assert server.proc is not None
    pid, port = server.proc.pid, server.port
    rss_start = _rss_mib(pid)
    attacker = subprocess.Popen(
        [sys.executable, "-m", "bench.http_attack", f"--port={port}", f"--seconds={ATTACK_S}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    latencies: list[float] = []
    failures: list[str] = []
    time.sleep(0.5)
    client = threading.Thread(target=_normal_client, args=(port, ATTACK_S - 1.0, latencies, failures))
    client.start()
    client.join()
    rss_during = _rss_mib(pid)
    out, _ = attacker.communicate(timeout=120)
    time.sleep(5.0)  # the attackers are gone: what stays?
    return {
        "normal_requests": len(latencies),
        "normal_failures": len(failures),
        "normal_p50_ms": float(np.percentile(latencies, 50) * 1e3) if latencies else float("nan"),
        "normal_p99_ms": float(np.percentile(latencies, 99) * 1e3) if latencies else float("nan"),
        "rss_mib": [round(rss_start), round(rss_during), round(_rss_mib(pid))],
        **json.loads(out),
    }


def candidate(layer: str, base_path: Path, extra: tuple[str, ...] = ()) -> Server:
    port = free_port()
    flags = [
        "--host=127.0.0.1", f"--port={free_port()}", f"--rest_api_port={port}", "--model_name=ctr",
        f"--model_base_path={base_path}", *LIMIT_FLAGS, *extra,
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "serving", *flags]
    if layer not in ("ours", "malloc_trim (shipped)"):
        cmd = [sys.executable, "-m", "bench.http_layer", "--serve", layer, "--", *flags]
    env = {**os.environ, **MMAP_ENV} if layer in ("mmap threshold 1 MiB", "both") else None
    return Server(layer, cmd, port, env=env)


def table(load: dict[tuple[str, int, str], dict[str, Any]], attacks: dict[str, dict[str, Any]]) -> str:
    lines = ["| layer | " + " | ".join(f"QPS c={c} | p99 ms c={c}" for c in CONNECTIONS) + " |"]
    lines.append("|---" * (1 + 2 * len(CONNECTIONS)) + "|")
    for layer in LAYERS:
        cells = []
        for c in CONNECTIONS:
            row = next(r for (name, conns, _), r in load.items() if name == layer and conns == c)
            cells += [f"{row['qps']:.0f}", f"{row['p99_ms']:.1f}"]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    lines += ["", "| layer | normal p99 ms (p50) | normal failures | dropped slow / holders / non-reader | "
              "pathological bodies | RSS MiB before / during / 5 s after |", "|---|---|---|---|---|---|"]  # fmt: skip
    for layer, a in attacks.items():
        d = a["dropped"]
        lines.append(
            f"| {layer} | {a['normal_p99_ms']:.1f} ({a['normal_p50_ms']:.1f}) | {a['normal_failures']} | "
            f"{d['slow']} / {d['holders']}/40 / {d['nonreader']}/1 | {'; '.join(a['pathological']) or '-'} | "
            f"{' / '.join(map(str, a['rss_mib']))} |"
        )
    return "\n".join(lines)


def memory_rounds(server: Server, rounds: int = 3) -> list[float]:
    """RSS growth (MiB) over the start, 2 s after each round of 40 clients holding 8 MiB bodies."""
    assert server.proc is not None
    start, growth = _rss_mib(server.proc.pid), []
    for _ in range(rounds):
        attacker = [
            sys.executable,
            "-m",
            "bench.http_attack",
            f"--port={server.port}",
            "--seconds=4",
            "--kinds=holders",
        ]
        subprocess.run(attacker, capture_output=True, check=True, timeout=120)
        time.sleep(2.0)
        growth.append(round(_rss_mib(server.proc.pid) - start, 1))
    return growth


def memory_table(base_path: Path, workdir: Path) -> str:
    lines = ["| malloc_trim / mmap threshold | RSS growth after round 1, 2, 3 (MiB) |", "|---|---|"]
    for variant in MEMORY_VARIANTS:
        # A body budget of 1 GiB lets all 40 holders in: the allocator, not the budget, is measured.
        server = candidate(variant, base_path, ("--max_buffered_bytes=1073741824",))
        server.start(workdir, [])
        try:
            lines.append(f"| {variant} | {', '.join(map(str, memory_rounds(server)))} |")
        finally:
            assert server.proc is not None
            procs.stop(server.proc)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--serve", choices=LAYERS[1:] + MEMORY_VARIANTS, help="run one candidate server (the flags follow --)"
    )
    p.add_argument("--memory", action="store_true", help="compare the ways of handing memory back instead")
    p.add_argument("--model_base_path", type=Path)
    p.add_argument("--seconds", type=int, default=5, help="per load point and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, help="also write the JSON results here")
    args, rest = p.parse_known_args()
    if args.serve:
        serve_with(args.serve, [a for a in rest if a != "--"])
        return
    if args.model_base_path is None:
        p.error("--model_base_path is required")
    procs.install_cleanup()
    workdir = Path(tempfile.mkdtemp(prefix="http-layer-"))
    if args.memory:
        print(memory_table(args.model_base_path, workdir))
        return
    script = write_lua(workdir / "one.lua", 1)
    servers = [candidate(layer, args.model_base_path) for layer in LAYERS]
    commands: list[str] = []
    try:
        for server in servers:
            server.start(workdir, commands)
        load = measure(servers, [(c, script) for c in CONNECTIONS], args.rounds, args.seconds, commands)
        attacks = {}
        for server in servers:
            attacks[server.name] = attack(server)
            assert server.proc is not None
            procs.stop(server.proc)  # one attack per server: what it left behind must not hit the next
    finally:
        for server in servers:
            if server.proc is not None:
                procs.stop(server.proc)
    print(table(load, attacks))
    if args.out:
        rows = [{**row, "script": key[2]} for key, row in load.items()]
        args.out.write_text(json.dumps({"load": rows, "attack": attacks, "commands": commands}, indent=1))


if __name__ == "__main__":
    main()
