"""How RSS comes back after rounds of 40 clients holding 8 MiB bodies, for each way of handing memory back.

python -m bench.http_layer --model_base_path artifacts/models/ctr --memory
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.harness import procs
from bench.harness.servers import Server
from bench.sections.http_candidates import MEMORY_VARIANTS, candidate, rss_mib


def memory_rounds(server: Server, rounds: int = 3) -> list[float]:
    """RSS growth (MiB) over the start, 2 s after each round of 40 clients holding 8 MiB bodies."""
    assert server.proc is not None
    start, growth = rss_mib(server.proc.pid), []
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
        growth.append(round(rss_mib(server.proc.pid) - start, 1))
    return growth


def memory_table(base_path: Path, workdir: Path) -> str:
    """One row per memory variant: the RSS growth after each round."""
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
