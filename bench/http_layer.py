"""Which HTTP layer should serve REST? Ours (serving/http/server.py) vs uvicorn+httptools vs granian (RSGI).

Same app logic for all (see `bench.sections.http_candidates`). In one run, on one machine, interleaved:
    load    wrk POSTing one instance at 1, 8 and 64 connections: QPS and p99
    attack  bench/http_attack.py (100 slow clients, 40 body holders, a non-reader, pathological bodies)
            for ATTACK_S while one keep-alive client predicts: its p99, what the server dropped, and its RSS
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
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import procs
from bench.harness.servers import Server, measure, write_lua
from bench.sections.http_candidates import LAYERS, MEMORY_VARIANTS, candidate, rss_mib, serve_with
from bench.sections.http_memory import memory_table

CONNECTIONS = (1, 8, 64)
ATTACK_S = 8.0
BODY = json.dumps({"instances": [[0.25] * 128]}).encode()
REQUEST = b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


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
    rss_start = rss_mib(pid)
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
    rss_during = rss_mib(pid)
    out, _ = attacker.communicate(timeout=120)
    time.sleep(5.0)  # the attackers are gone: what stays?
    return {
        "normal_requests": len(latencies),
        "normal_failures": len(failures),
        "normal_p50_ms": float(np.percentile(latencies, 50) * 1e3) if latencies else float("nan"),
        "normal_p99_ms": float(np.percentile(latencies, 99) * 1e3) if latencies else float("nan"),
        "rss_mib": [round(rss_start), round(rss_during), round(rss_mib(pid))],
        **json.loads(out),
    }


def table(load: dict[tuple[str, int, str], dict[str, Any]], attacks: dict[str, dict[str, Any]]) -> str:
    """The load table (QPS and p99 per connection count) and the attack table, in Markdown."""
    lines = ["| layer | " + " | ".join(f"QPS c={c} | p99 ms c={c}" for c in CONNECTIONS) + " |"]
    lines.append("|---" * (1 + 2 * len(CONNECTIONS)) + "|")
    for layer in LAYERS:
        cells = []
        for c in CONNECTIONS:
            row = next(r for (name, conns, _), r in load.items() if name == layer and conns == c)
            cells += [f"{row['qps']:.0f}", f"{row['p99_ms']:.1f}"]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| layer | normal p99 ms (p50) | normal failures | dropped slow / holders / non-reader | "
        "pathological bodies | RSS MiB before / during / 5 s after |",
        "|---|---|---|---|---|---|",
    ]
    for layer, a in attacks.items():
        d = a["dropped"]
        lines.append(
            f"| {layer} | {a['normal_p99_ms']:.1f} ({a['normal_p50_ms']:.1f}) | {a['normal_failures']} | "
            f"{d['slow']} / {d['holders']}/40 / {d['nonreader']}/1 | {'; '.join(a['pathological']) or '-'} | "
            f"{' / '.join(map(str, a['rss_mib']))} |"
        )
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
