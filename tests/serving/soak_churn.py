"""`make soak`: the server under churn for a few minutes, with its memory watched (issue 44).

One server (`--num_workers=2`, `--enable_batching`) on a realistic version (tests/serving/reload_memory.py), and:
    load       client threads on four routes, back to back: a raw row by field names, a 128-float vector,
               a ranking request (RANK_ROWS raw rows in one body), and a v2 `infer` of features;
    publish    a new version every PUBLISH_S, the operator's way (copied beside, renamed into place);
    kill       a worker SIGKILLed every KILL_S (the parent restarts it);
    malformed  a burst of bad requests every BURST_S (bad JSON, wrong widths, booleans, unknown models, bad
               versions, ...), each on its own connection.
It fails (exit 1) on: a good request lost (not answered 200 after one retry on a new connection, RETRY_AFTER_S
later), any 5xx, a bad request not answered 4xx, a published version not served within SERVED_S, or an RSS of
the server's process tree at the end more than RSS_MIB over its value after the warm-up. Every figure is
printed. Run by `make soak` (never by `make test` or `make test-slow`); `--seconds` sets the churn's length,
`--version DIR` serves an already exported version (default: one exported now, ~30 s).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.serving.reload_memory import (
    MIB,
    export_version,
    labelled_versions,
    process_tree,
    publish,
    settled_rss,
)
from tests.serving.server_process import ServerProcess

PUBLISH_S, KILL_S, BURST_S = 15.0, 30.0, 20.0
SERVED_S = 15.0
# A retry's backoff: the kernel resets the connections queued at a worker as it is SIGKILLed, and a connection
# made in that same instant can land in the same dying queue; 100 ms later only live workers listen.
RETRY_AFTER_S = 0.1
RSS_MIB = 64
WARMUP_S = 20.0
RANK_ROWS = 100
THREADS = ("raw", "raw", "vector", "ranking", "v2")
PREDICT = "/v1/models/ctr:predict"
ROW = {"I1": 3, "I2": 20, "I5": 1520, "C1": "68fd1e64", "C2": "80e26c9b", "C6": "fbad5c96"}


def good_requests() -> dict[str, tuple[str, bytes]]:
    """route -> (path, body) of the good requests."""
    rng = random.Random(7)
    ranking = [{**ROW, "I1": i, "C3": f"{rng.getrandbits(32):08x}"} for i in range(RANK_ROWS)]
    vector = [round(rng.random(), 4) for _ in range(128)]
    v2 = {"inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32", "data": vector}]}
    return {
        "raw": (PREDICT, json.dumps({"instances": [ROW]}).encode()),
        "vector": (PREDICT, json.dumps({"instances": [vector]}).encode()),
        "ranking": (PREDICT, json.dumps({"instances": ranking}).encode()),
        "v2": ("/v2/models/ctr/infer", json.dumps(v2).encode()),
    }


BAD = [
    (PREDICT, b'{"instances": [[0.1, 0.2'),  # truncated JSON
    (PREDICT, json.dumps({"instances": [[0.5] * 127]}).encode()),  # wrong width
    (PREDICT, json.dumps({"instances": [[True] * 128]}).encode()),  # booleans
    (PREDICT, json.dumps({"instances": []}).encode()),  # nothing
    (PREDICT, json.dumps({"instances": [{"I1": "many"}]}).encode()),  # a count that is no number
    (PREDICT, json.dumps({"instances": [{"C1": 12345678}]}).encode()),  # a categorical that is no string
    (PREDICT, json.dumps({"nothing": 1}).encode()),  # neither instances nor inputs
    (PREDICT, b"\xff\xfe not json"),
    ("/v1/models/nope:predict", json.dumps({"instances": [ROW]}).encode()),  # unknown model
    ("/v1/models/ctr/versions/01:predict", json.dumps({"instances": [ROW]}).encode()),  # no such version form
    ("/v1/models/ctr/versions/999999:predict", json.dumps({"instances": [ROW]}).encode()),  # not loaded
    ("/v2/models/ctr/infer", json.dumps({"inputs": [{"name": "features", "shape": [1, 3]}]}).encode()),
]


class Tally:
    """What happened, counted from every thread (one lock: the counts are the only shared state)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.versions: dict[int, float] = {}  # version -> when an answer of it was first seen

    def add(self, key: str, failure: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if failure is not None and len(self.failures) < 50:
                self.failures.append(failure)

    def seen(self, version: int) -> None:
        if version not in self.versions:
            with self.lock:
                self.versions.setdefault(version, time.monotonic())


class Client:
    """One keep-alive connection; `send` retries once on a new one when the first try did not get `want`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def _once(self, path: str, body: bytes) -> tuple[int, dict[str, str]]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self.conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}

    def send(self, path: str, body: bytes, good: bool) -> tuple[list[int | str], dict[str, str]]:
        """The answers of the tries (a status, or the error's name) and the last answer's headers."""
        answers: list[int | str] = []
        headers: dict[str, str] = {}
        for _ in range(2):
            try:
                status, headers = self._once(path, body)
                answers.append(status)
            except (OSError, http.client.HTTPException) as exc:  # e.g. its worker was killed
                answers.append(type(exc).__name__)
                status = 0
            if status == 200 if good else 400 <= status < 500:
                break
            self.close()  # the retry goes on a new connection, after a client's backoff (RETRY_AFTER_S)
            time.sleep(RETRY_AFTER_S)
        return answers, headers

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def load(port: int, route: str, path: str, body: bytes, tally: Tally, stop: threading.Event) -> None:
    client = Client(port)
    while not stop.is_set():
        answers, headers = client.send(path, body, good=True)
        version = headers.get("x-model-version")
        if version is not None:
            tally.seen(int(version))
        failure = None
        if answers[-1] != 200:
            failure = f"{route}: lost, answers {answers}"
        elif any(isinstance(a, int) and a >= 500 for a in answers):
            failure = f"{route}: a 5xx among {answers}"
        tally.add(route if failure is None else f"{route} failed", failure)
        tally.add(f"{route} retried" if len(answers) > 1 else f"{route} first try")
    client.close()


def burst(port: int, tally: Tally) -> None:
    """Every bad request once, each on a new connection: each must get a 4xx."""
    for path, body in BAD:
        client = Client(port)
        answers, _ = client.send(path, body, good=False)
        client.close()
        last = answers[-1]
        ok = (
            isinstance(last, int)
            and 400 <= last < 500
            and not any(isinstance(a, int) and a >= 500 for a in answers)
        )
        tally.add(
            "bad answered 4xx" if ok else "bad failed", None if ok else f"bad {path} {body[:40]!r}: {answers}"
        )


def workers(parent: int) -> list[int]:
    """The server's workers: the parent's direct children."""
    tree = set(process_tree(parent))
    found = []
    for pid in tree - {parent}:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(pid)
    return sorted(found)


def churn(server: ServerProcess, source: Path, base: Path, seconds: float) -> tuple[Tally, dict[str, Any]]:
    """Load, publishes, kills and bursts for `seconds` after a warm-up; returns the tally and the figures."""
    tally, stop = Tally(), threading.Event()
    requests = good_requests()
    threads = [
        threading.Thread(target=load, args=(server.rest_port, r, *requests[r], tally, stop), daemon=True)
        for r in THREADS
    ]
    for thread in threads:
        thread.start()
    figures: dict[str, Any] = {"published": [], "kills": 0, "bursts": 0}
    time.sleep(WARMUP_S)  # the load warms both workers up (allocator, batcher, decoder children)
    figures["rss_warm"] = settled_rss(server.proc.pid, timeout_s=5)
    start, version = time.monotonic(), 1
    next_publish, next_kill, next_burst = start + PUBLISH_S, start + KILL_S, start + BURST_S
    while time.monotonic() < start + seconds:
        now = time.monotonic()
        if now >= next_publish:
            version += 1
            publish(source, base, version)
            figures["published"].append((version, time.monotonic()))
            next_publish += PUBLISH_S
        if now >= next_kill:
            pids = workers(server.proc.pid)
            if pids:
                os.kill(pids[figures["kills"] % len(pids)], signal.SIGKILL)
                figures["kills"] += 1
            next_kill += KILL_S
        if now >= next_burst:
            burst(server.rest_port, tally)
            figures["bursts"] += 1
            next_burst += BURST_S
        time.sleep(0.05)
    if figures["published"]:  # the load goes on until the last version is served (or SERVED_S passed)
        last, published = figures["published"][-1]
        while last not in tally.versions and time.monotonic() < published + SERVED_S:
            time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(60)
    # Metric series of the served version only, once every worker has unloaded the one before (and the folded
    # totals of killed workers have let go of theirs).
    served = {figures["published"][-1][0] if figures["published"] else 1}
    deadline = time.monotonic() + SERVED_S
    while not (labelled := labelled_versions(server)) <= served and time.monotonic() < deadline:
        time.sleep(0.2)
    figures["series_versions"] = sorted(labelled)
    figures["rss_end"] = settled_rss(server.proc.pid)
    return tally, figures


def report(tally: Tally, figures: dict[str, Any], seconds: float) -> list[str]:
    """Print every figure; returns the failures."""
    failures = list(tally.failures)
    served = []
    for version, published in figures["published"]:
        seen = tally.versions.get(version)
        late = None if seen is None else seen - published
        served.append(f"{version}: {'never' if late is None else f'{max(late, 0):.1f} s'}")
        if late is None or late > SERVED_S:
            failures.append(f"version {version} not served within {SERVED_S:g} s of its publish")
    good = sum(tally.counts[r] for r in set(THREADS))
    print(f"churn {seconds:g} s: {good} good requests answered 200 ({good / seconds:.0f}/s)")
    for key in sorted(tally.counts):
        print(f"  {key}: {tally.counts[key]}")
    print(f"  published {len(figures['published'])} versions; served after: {', '.join(served)}")
    print(
        f"  workers SIGKILLed: {figures['kills']}; malformed bursts: {figures['bursts']} x {len(BAD)} requests"
    )
    warm, end = figures["rss_warm"], figures["rss_end"]
    print(
        f"  process tree RSS: {warm / MIB:.0f} MiB after warm-up, {end / MIB:.0f} MiB at the end ({(end - warm) / MIB:+.1f})"
    )
    print(f"  versions with metric series at the end: {figures['series_versions']}")
    if len(figures["series_versions"]) > 1:
        failures.append(f"metric series of unloaded versions remain: {figures['series_versions']}")
    if end - warm > RSS_MIB * MIB:
        failures.append(f"RSS grew {(end - warm) / MIB:.0f} MiB (> {RSS_MIB})")
    for name in ("failed", "bad failed"):
        if any(k.endswith(name) for k in tally.counts):
            failures.append(f"{sum(v for k, v in tally.counts.items() if k.endswith(name))} requests {name}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="length of the churn, after the warm-up")
    parser.add_argument("--version", type=Path, default=None, help="an exported version folder to serve")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        source = args.version or export_version(Path(tmp) / "export")
        print(f"version to publish: {source} ({time.monotonic() - started:.0f} s)", flush=True)
        base = Path(tmp) / "models" / "ctr"
        base.mkdir(parents=True)
        publish(source, base, 1)
        flags = ("--num_workers=2", "--enable_batching", "--file_system_poll_wait_seconds=0.5")
        server = ServerProcess(base, Path(tmp) / "server.log", *flags)
        try:
            server.wait_ready(120)
            tally, figures = churn(server, source, base, args.seconds)
        finally:
            code = server.stop()
        failures = report(tally, figures, args.seconds)
        log = server.log()
        leaked = [line for line in log.splitlines() if "is still referenced" in line]
        failures += [f"leak: {line}" for line in leaked[:5]]
        if code != 0:
            failures.append(f"the server exited with {code}")
    print(f"soak: {time.monotonic() - started:.0f} s in all")
    for failure in failures:
        print(f"FAIL {failure}")
    print("soak: PASS" if not failures else f"soak: FAIL ({len(failures)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
