"""Request logs and clicks with every case the click join counts, for comparing its two engines.

Three intervals of 100 s from T (the window 30 s): per-pod log folders, several files, duplicates (retries),
requests without raw fields, shadow lines (one without its primary), bad lines (first and middle of a file),
a last line still without its newline, clicks inside and outside the window, duplicate clicks, clicks before
their request (clock skew), unknown ids and instances, clicks on requests of the neighbouring intervals.
"""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path

T = 1_800_000_000.0
INTERVAL_S, WINDOW_S = 100.0, 30.0
ROW = {"I1": 3, "I5": 1382, "C1": "68fd1e64", "C9": "a73ee510"}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _line(rid: str, t: float, n: int, *, shadow: bool = False, raw: bool = True, version: int = 1) -> str:
    entry = {
        "request_id": rid,
        "time": iso(t),
        "model": {"name": "ctr", "version": version, "label": "shadow" if shadow else "stable"},
        "canary": version == 2,
        "shadow": shadow,
        "inputs": None
        if shadow
        else ({"instances": [dict(ROW, I1=k) for k in range(n)]} if raw else {"x": 1}),
        "outputs": [[round(0.1 + 0.01 * k + (0.3 if shadow else 0), 4)] for k in range(n)],
    }
    return json.dumps(entry)


def _write(path: Path, lines: list[str], mtime: float, tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines) + tail)
    os.utime(path, (mtime, mtime))


def make(root: Path, seed: int = 5, requests: int = 300) -> tuple[Path, Path]:
    """Write ROOT/logs and ROOT/clicks; returns them."""
    rng = random.Random(seed)
    logs, clicks = root / "logs", root / "clicks"
    files: dict[str, list[str]] = {}
    issued: list[tuple[str, float, int]] = []
    for k in range(requests):
        t = T - 40 + k * (380 / requests) + rng.random() * 0.5
        rid, n = f"r{k:04d}", rng.choice((1, 1, 2, 3))
        pod = f"pod-{k % 3}/requests-{k % 3}-{int((t - T) // 60) + 1}.jsonl"
        files.setdefault(pod, []).append(_line(rid, t, n, raw=k % 17 != 5, version=1 + (k % 4 == 0)))
        issued.append((rid, t, n))
        if k % 11 == 0:  # a retry, logged again (same id) a little later
            files[pod].append(_line(rid, t + 0.3, n))
        if k % 7 == 0:  # a shadow line of the same request
            files[pod].append(_line(rid, t + 0.01, n, shadow=True, version=3))
        if k % 29 == 0:
            files[pod].append("{not json")
    files.setdefault("pod-1/requests-1-9.jsonl", []).insert(0, '{"request_id": "", "time": 1}')
    files["pod-2/requests-2-1.jsonl"].append(_line("orphan-shadow", T + 50, 1, shadow=True))
    for name, lines in files.items():
        stamps = [json.loads(x)["time"] for x in lines if x.startswith('{"request_id": "r')]
        last = max((datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() for s in stamps), default=T)
        _write(logs / name, lines, last + 1, tail='{"request_id": "cut' if name.endswith("-2.jsonl") else "")
    events: list[tuple[float, str]] = []
    for rid, t, n in issued:
        for i in range(n):
            u = rng.random()
            if u < 0.25:
                dt = rng.uniform(0, WINDOW_S)
            elif u < 0.3:
                dt = rng.uniform(WINDOW_S + 0.01, WINDOW_S + 20)  # late
            elif u < 0.33:
                dt = -rng.uniform(0.01, 3)  # before its request: clock skew
            else:
                continue
            c = {"request_id": rid, "instance": i, "time": t + dt}
            events.append((t + dt, json.dumps(c)))
            if rng.random() < 0.1:
                events.append((t + dt, json.dumps(c)))  # the same click twice
        if rng.random() < 0.05:
            events.append((t + 1, json.dumps({"request_id": rid, "instance": n + 2, "time": t + 1})))
    for k in range(10):
        t = T + k * 35
        events.append((t, json.dumps({"request_id": f"nobody-{k}", "instance": 0, "time": t})))
    events.sort()
    per_file: dict[str, list[str]] = {}
    for t, line in events:
        per_file.setdefault(f"clicks-{int((t - T) // 90) + 1}.jsonl", []).append(line)
    per_file["clicks-2.jsonl"].insert(3, '{"request_id": "x", "instance": -1, "time": 1}')
    per_file["clicks-3.jsonl"].insert(0, "garbage")
    for name, lines in per_file.items():
        _write(clicks / name, lines, T + 1000)
    return logs, clicks
