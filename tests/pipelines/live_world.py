"""A synthetic served world for the live evaluation's tests: request log files and click events, no server.

Each request's true click logit is z ~ N(-1.5, 1); a version scores it sigmoid(z + N(0, noise) + bias) (noise 0,
bias 0: a perfect, calibrated version), and the request is clicked with probability sigmoid(z), within the
attribution window. Versions take shares of the traffic by a hash of the request id; a shadow version scores the
same requests again (a shadow line). Log files roll over every `file_s` seconds, as a server's do by size, so a
join reads the recent files only.

    python -m tests.pipelines.live_world --out /tmp/world --start 1700000000 --seconds 400 --rate 500
"""

from __future__ import annotations

import argparse
import json
import math
import os
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROW = {"I1": 3, "I5": 1382, "C1": "68fd1e64", "C9": "a73ee510"}


@dataclass(frozen=True)
class Version:
    """One served version: its share of the requests (percent), its scoring noise and bias (logit)."""

    version: int
    label: str | None
    share: float
    noise: float = 0.5
    bias: float = 0.0
    canary: bool = False
    since: float = -math.inf  # serves requests logged from this time on
    until: float = math.inf


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _pick(request_id: str, versions: list[Version], t: float) -> Version | None:
    live = [v for v in versions if v.since <= t < v.until]
    if not live:
        return None
    point = zlib.crc32(request_id.encode()) / 2**32 * sum(v.share for v in live)
    for v in live:
        point -= v.share
        if point < 0:
            return v
    return live[-1]


def write_world(
    folder: Path,
    start: float,
    seconds: float,
    rate: float,
    versions: list[Version],
    shadow: Version | None = None,
    attribution_s: float = 5.0,
    seed: int = 0,
    file_s: float = 10.0,
    model: str = "ctr",
) -> dict[str, int]:
    """Write folder/logs/requests-1-N.jsonl and folder/clicks/clicks-N.jsonl; returns what was written."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    times = start + np.arange(n) / rate
    z = rng.normal(-1.5, 1.0, n)
    clicked = rng.random(n) < _sigmoid(z)
    delays = rng.uniform(0.0, 0.9 * attribution_s, n)
    noise = rng.normal(0.0, 1.0, (2, n))
    logs, clicks = folder / "logs", folder / "clicks"
    logs.mkdir(parents=True, exist_ok=True)
    clicks.mkdir(parents=True, exist_ok=True)
    files: dict[int, list[str]] = {}
    click_lines: list[tuple[float, str]] = []
    written = {"requests": 0, "shadow": 0, "clicks": 0}
    for i in range(n):
        rid, t = f"r{seed}-{i}", float(times[i])
        v = _pick(rid, versions, t)
        if v is None:
            continue
        score = float(_sigmoid(np.array(z[i] + v.noise * noise[0, i] + v.bias)))
        entry = {
            "request_id": rid,
            "time": iso(t),
            "model": {"name": model, "version": v.version, "label": v.label},
            "canary": v.canary,
            "shadow": False,
            "fallback": None,
            "inputs": {"instances": [ROW]},
            "outputs": [[score]],
        }
        lines = files.setdefault(int((t - start) // file_s), [])
        lines.append(json.dumps(entry))
        written["requests"] += 1
        if shadow is not None and shadow.since <= t < shadow.until:
            s_score = float(_sigmoid(np.array(z[i] + shadow.noise * noise[1, i] + shadow.bias)))
            entry = {**entry, "model": {"name": model, "version": shadow.version, "label": "shadow"}}
            lines.append(json.dumps({**entry, "shadow": True, "inputs": None, "outputs": [[s_score]]}))
            written["shadow"] += 1
        if clicked[i]:
            click_t = t + float(delays[i])
            click_lines.append((click_t, json.dumps({"request_id": rid, "instance": 0, "time": click_t})))
            written["clicks"] += 1
    for k, lines in files.items():
        path = logs / f"requests-1-{k + 1}.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        last = start + (k + 1) * file_s
        os.utime(path, (last, last))
    click_lines.sort()
    last_click = click_lines[-1][0] if click_lines else start
    for k in range(int((last_click - start) // file_s) + 1):
        lo, hi = start + k * file_s, start + (k + 1) * file_s
        part = [line for t, line in click_lines if lo <= t < hi]
        if part:
            path = clicks / f"clicks-{k + 1}.jsonl"
            path.write_text("".join(line + "\n" for line in part))
            os.utime(path, (hi, hi))
    return written


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m tests.pipelines.live_world", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--start", type=float, default=1_700_000_000.0)
    p.add_argument("--seconds", type=float, default=400.0)
    p.add_argument("--rate", type=float, default=500.0, help="requests per second")
    p.add_argument("--attribution-s", type=float, default=5.0)
    args = p.parse_args()
    versions = [Version(1, "stable", 90.0), Version(2, "canary", 10.0, noise=1.0, canary=True)]
    print(
        write_world(
            args.out,
            args.start,
            args.seconds,
            args.rate,
            versions,
            Version(3, "shadow", 0.0),
            args.attribution_s,
        )
    )


if __name__ == "__main__":
    main()
