"""Compressed REST bodies through our server (issue 35): what a gzip request costs the server, and where
compressing a response starts to pay.

    python -m bench.compression [MODEL_BASE_PATH] [--requests 1000] [--rounds 5]

1. Requests: the server process's CPU time per request (user + system, from /proc) for one 100-row raw body
   (`--requests` requests, one keep-alive connection, sequential), sent plain, gzip and deflate, interleaved
   in `--rounds` rounds. The bodies are compressed once, before the rounds: only the server's cost is counted.
2. Responses: for predict answers of 1 to 1000 rows, in-process: zlib's CPU time at levels 1 and 6 against the
   bytes it saves; on loopback: the server's CPU per request with `Accept-Encoding: gzip` and without
   (`--response_compression_min_bytes=0`: every answer compressed).
Without MODEL_BASE_PATH a small raw-signature version is built (tests/serving/raw_model_repo.py).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from bench.harness import procs
from bench.harness.servers import free_port, wait_until_serving

ROWS = 100
RESPONSE_ROWS = (1, 10, 40, 80, 120, 160, 330, 1000)  # ~12 bytes of JSON a row: 40 B to 12 KB


def process_cpu_s(pid: int) -> float:
    """CPU seconds the process's live threads have run, in ns resolution (/proc/PID/task/*/schedstat).

    /proc/PID/stat counts clock ticks (10 ms): too coarse for a few hundred requests of ~1 ms.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):  # a thread that just ended
            continue
    return total / 1e9


def start_server(base: Path, workdir: Path, *flags: str) -> tuple[Any, int]:
    """Our server on 127.0.0.1, one worker, one intra-op thread; (process, REST port)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "serving",
        "--host=127.0.0.1",
        f"--port={free_port()}",
        f"--rest_api_port={port}",
        "--model_name=ctr",
        f"--model_base_path={base}",
        "--num_workers=1",
        "--intra_op_threads=1",
        *flags,
    ]
    log = workdir / f"server-{port}.log"
    proc = procs.start(cmd, log=log)
    url = f"http://127.0.0.1:{port}/v1/models/ctr:predict"
    wait_until_serving(url, json.dumps({"instances": [[0.5] * 128]}).encode(), proc, log, timeout_s=120)
    return proc, port


def raw_body(rows: int) -> bytes:
    """`rows` raw Criteo rows (serving/app/curl_example.py's row, I1 varied) for the `raw` signature."""
    from serving.app.curl_example import CRITEO_ROW

    instances = [{**CRITEO_ROW, "I1": i} for i in range(1, rows + 1)]
    return json.dumps({"signature_name": "raw", "instances": instances}).encode()


def cpu_per_request_us(
    proc: Any, port: int, body: bytes, headers: dict[str, str], n: int, path: str = "/v1/models/ctr:predict"
) -> float:
    """The server's CPU microseconds per request over `n` sequential requests on one connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    send = {"Content-Type": "application/json", **headers}
    try:
        for _ in range(20):  # warm: the connection, the path, the allocator
            conn.request("POST", path, body, send)
            conn.getresponse().read()
        start = process_cpu_s(proc.pid)
        for _ in range(n):
            conn.request("POST", path, body, send)
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
        end = process_cpu_s(proc.pid)
    finally:
        conn.close()
    return (end - start) / n * 1e6


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def measure_requests(base: Path, workdir: Path, n: int, rounds: int) -> dict[str, Any]:
    """Part 1: plain / gzip / deflate request bodies of ROWS raw rows, interleaved rounds."""
    body = raw_body(ROWS)
    kinds = {
        "plain": (body, {}),
        "gzip": (gzip.compress(body), {"Content-Encoding": "gzip"}),
        "deflate": (zlib.compress(body), {"Content-Encoding": "deflate"}),
    }
    proc, port = start_server(base, workdir)
    runs: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for _ in range(rounds):
            for kind, (payload, headers) in kinds.items():
                runs[kind].append(cpu_per_request_us(proc, port, payload, headers, n))
    finally:
        procs.stop(proc)
    out: dict[str, Any] = {
        "body_bytes": {k: len(v[0]) for k, v in kinds.items()},
        "cpu_us_per_request": {k: summary(v) for k, v in runs.items()},
    }
    plain = statistics.median(runs["plain"])
    out["gzip_extra_cpu_us"] = round(statistics.median(runs["gzip"]) - plain, 1)
    out["gzip_ratio"] = round(statistics.median(runs["gzip"]) / plain, 3)
    return out


def zlib_us(body: bytes, level: int, repeat: int = 200) -> float:
    start = time.process_time()
    for _ in range(repeat):
        packer = zlib.compressobj(level, zlib.DEFLATED, 31)
        packer.compress(body)
        packer.flush()
    return (time.process_time() - start) / repeat * 1e6


def measure_responses(base: Path, workdir: Path, n: int, rounds: int) -> list[dict[str, Any]]:
    """Part 2: per response size, zlib's cost and savings, and the server's CPU with and without gzip."""
    proc, port = start_server(base, workdir, "--response_compression_min_bytes=0")
    rows_out = []
    try:
        for rows in RESPONSE_ROWS:
            request = json.dumps({"instances": [[0.5 + i * 1e-3] * 128 for i in range(rows)]}).encode()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/v1/models/ctr:predict", request)
            answer = conn.getresponse().read()
            conn.close()
            plain_runs, gzip_runs = [], []
            for _ in range(rounds):
                plain_runs.append(cpu_per_request_us(proc, port, request, {}, n))
                gzip_runs.append(cpu_per_request_us(proc, port, request, {"Accept-Encoding": "gzip"}, n))
            packed = len(gzip.compress(answer, 1))
            rows_out.append(
                {
                    "rows": rows,
                    "response_bytes": len(answer),
                    "gzip1_bytes": packed,
                    "gzip6_bytes": len(gzip.compress(answer, 6)),
                    "saved_bytes": len(answer) - packed,
                    "zlib1_us": round(zlib_us(answer, 1), 1),
                    "zlib6_us": round(zlib_us(answer, 6), 1),
                    "server_cpu_us_plain": summary(plain_runs),
                    "server_cpu_us_gzip": summary(gzip_runs),
                }
            )
    finally:
        procs.stop(proc)
    return rows_out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compression", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_base_path", nargs="?", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=1000, help="requests per kind per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip_responses", action="store_true", help="only part 1 (request bodies)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        workdir = Path(tmp)
        base = args.model_base_path
        if base is None:
            from tests.serving.raw_model_repo import fit_spec, write_raw_version

            base = workdir / "ctr"
            write_raw_version(base, 1, fit_spec())
        result: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python -m bench.compression " + " ".join(argv if argv is not None else sys.argv[1:]),
            "requests": measure_requests(base, workdir, args.requests, args.rounds),
        }
        if not args.skip_responses:
            result["responses"] = measure_responses(base, workdir, max(args.requests // 4, 50), args.rounds)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
