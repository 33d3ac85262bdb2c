"""The HTTP-layer candidates: how each one is started, all as `python -m serving` with one part swapped.

A layer (`LAYERS`) swaps `serving`'s HttpServer for a peer adapter (`bench.peers.http_layers`); a memory variant
(`MEMORY_VARIANTS`) switches part of serving/http/memory.py off. Everything else (model loading, RestApp, the
predictor, gRPC, the metrics) is the very same code. A swapped candidate runs as
`python -m bench.http_layer --serve NAME -- <python -m serving flags>`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.harness.servers import Server, free_port

LAYERS = ("ours", "uvicorn+httptools", "granian rsgi")
# Our server with some of serving/http/memory.py switched off: which part brings the RSS back?
MEMORY_VARIANTS = ("neither", "malloc_trim (shipped)", "mmap threshold 1 MiB", "both")
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # glibc: fixed, so large frees no longer raise it
LIMIT_FLAGS = ["--header_timeout_seconds=2", "--body_timeout_seconds=2", "--keepalive_timeout_seconds=5"]


def serve_with(layer: str, flags: list[str]) -> None:
    """Run `python -m serving flags` with the HTTP layer `layer` (in this process)."""
    import serving.app.server
    import serving.http.server
    from bench.peers.http_layers import GranianLayer, UvicornLayer
    from serving.__main__ import main

    if layer in ("neither", "mmap threshold 1 MiB"):
        serving.http.server.release_freed_memory = lambda: None  # type: ignore[assignment]
    if layer == "uvicorn+httptools":
        serving.app.server.HttpServer = UvicornLayer  # type: ignore[misc,assignment]
    elif layer == "granian rsgi":
        serving.app.server.HttpServer = GranianLayer  # type: ignore[misc,assignment]
    main(flags)


def rss_mib(pid: int) -> float:
    """The resident memory of process `pid` in MiB (NaN once it is gone)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def candidate(layer: str, base_path: Path, extra: tuple[str, ...] = ()) -> Server:
    """The server for a layer or memory variant on free 127.0.0.1 ports (not started yet)."""
    port = free_port()
    flags = [
        "--host=127.0.0.1",
        f"--port={free_port()}",
        f"--rest_api_port={port}",
        "--model_name=ctr",
        f"--model_base_path={base_path}",
        *LIMIT_FLAGS,
        *extra,
    ]
    cmd = [sys.executable, "-m", "serving", *flags]
    if layer not in ("ours", "malloc_trim (shipped)"):
        cmd = [sys.executable, "-m", "bench.http_layer", "--serve", layer, "--", *flags]
    env = {**os.environ, **MMAP_ENV} if layer in ("mmap threshold 1 MiB", "both") else None
    return Server(layer, cmd, port, env=env)
