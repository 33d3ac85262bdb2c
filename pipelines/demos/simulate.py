"""`python -m pipelines.demos.simulate`: live traffic from the drifting synthetic world, sent to a running server.

    python -m pipelines.demos.simulate --url http://127.0.0.1:8501 --clicks-dir CLICKS --start-day 0 --end-day 0.25 \\
        --duration 300 --rate 20 --drift-scale 20

Each request carries --instances raw rows of the world's current time and an `x-request-id`. World time moves
from --start-day to --end-day over --duration seconds. For each row the world's click model clicks (a coin
with the row's true probability), a click event `{"request_id", "instance", "time"}` is appended to
CLICKS/clicks-<pid>-<n>.jsonl after a random delay (exponential, mean --click-delay-s); --duplicate-rate of
clicks are sent twice. With --truth-dir, every request's true click probabilities are written there too (the
oracle of `make online-demo`; a real click stream has none). With --summary, the counts go to that file as JSON
too: requests sent and failed, the failures by HTTP status or exception, and the answers by the version that
gave them (the `x-model-version` response header). SIGINT or SIGTERM stops the traffic early with the counts so far.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import http.client
import itertools
import json
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from training.synth import hex_values, make_world, sample_rows
from training.truth import GroundTruth, effective_day

WORLD_STEP_S = 2.0  # the click model is recomputed (and recalibrated) this often, in wall seconds
ROTATE_S = 30.0  # a new clicks file this often, so the join skips old files by their mtime
CALIBRATION_ROWS = 20_000


def instances(counts: np.ndarray, ids: np.ndarray) -> list[dict[str, Any]]:
    """Generated rows as REST `instances` of the raw signature (missing values left out)."""
    cats = [hex_values(j, ids[:, j]).to_pylist() for j in range(ids.shape[1])]
    rows = []
    for i in range(counts.shape[0]):
        row: dict[str, Any] = {
            f: int(counts[i, j]) for j, f in enumerate(NUMERIC_FIELDS) if not np.isnan(counts[i, j])
        }
        row |= {f: cats[j][i] for j, f in enumerate(CATEGORICAL_FIELDS) if cats[j][i] is not None}
        rows.append(row)
    return rows


class ClickWriter:
    """Appends due click events to the clicks folder, one file per ROTATE_S, each line flushed."""

    def __init__(self, folder: Path, tag: str) -> None:
        self.folder, self.tag = folder, tag
        folder.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = None
        self._opened = 0.0
        self._n = 0
        self.written = 0

    def write(self, event: dict[str, Any]) -> None:
        if self._file is None or time.time() - self._opened > ROTATE_S:
            if self._file is not None:
                self._file.close()
            self._n += 1
            self._file = (self.folder / f"clicks-{self.tag}-{self._n:06d}.jsonl").open("a")
            self._opened = time.time()
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Simulator:
    """The world clock, the request sender and the click scheduler."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.rng = np.random.default_rng(args.seed)
        url = urlsplit(args.url)
        self.conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 8501, timeout=30)
        self.path = f"/v1/models/{args.model}:predict"
        self.clicks = ClickWriter(args.clicks_dir, f"{args.seed}")
        if args.truth_dir:
            args.truth_dir.mkdir(parents=True, exist_ok=True)
        self.truth = (args.truth_dir / f"truth-{args.seed}.jsonl").open("a") if args.truth_dir else None
        self.due: list[tuple[float, int, str, int]] = []  # (time, tie-break, request id, instance)
        self.sent = self.failed = self.rows = 0
        self.errors: collections.Counter[str] = collections.Counter()  # HTTP status or exception name
        self.answered_by: collections.Counter[str] = collections.Counter()  # x-model-version
        self._seq = itertools.count()
        self._world: tuple[float, GroundTruth] | None = None

    def day(self, elapsed: float) -> float:
        a = self.a
        return a.start_day + (a.end_day - a.start_day) * min(1.0, elapsed / a.duration)

    def world(self, day: float) -> GroundTruth:
        if self._world is None or time.monotonic() - self._world[0] >= WORLD_STEP_S:
            self._world = (
                time.monotonic(),
                make_world(effective_day(day, self.a.drift_scale), CALIBRATION_ROWS),
            )
        return self._world[1]

    def send(self, n: int, day: float) -> None:
        """One request of `n` rows of `day`; schedules its clicks."""
        eff = effective_day(day, self.a.drift_scale)
        counts, ids = sample_rows(self.rng, n, eff)
        p = 1.0 / (1.0 + np.exp(-self.world(day).logit(counts, ids)))
        request_id = f"sim{self.a.seed}-{self.sent}"
        body = json.dumps({"instances": instances(counts, ids)})
        try:
            self.conn.request(
                "POST", self.path, body, {"Content-Type": "application/json", "x-request-id": request_id}
            )
            resp = self.conn.getresponse()
            resp.read()
            ok = resp.status == 200
            why = str(resp.status)
            self.answered_by[resp.getheader("x-model-version") or "none"] += ok
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            ok, why = False, type(e).__name__
        self.sent += 1
        if not ok:
            self.failed += 1
            self.errors[why] += 1
            return
        now = time.time()
        self.rows += n
        if self.truth is not None:
            self.truth.write(
                json.dumps({"request_id": request_id, "day": day, "p": [round(float(x), 6) for x in p]})
                + "\n"
            )
        for i in np.flatnonzero(self.rng.random(n) < p):
            for _ in range(2 if self.rng.random() < self.a.duplicate_rate else 1):
                at = now + float(self.rng.exponential(self.a.click_delay_s))
                heapq.heappush(self.due, (at, next(self._seq), request_id, int(i)))

    def flush(self, until: float) -> None:
        """Write every click due by `until`."""
        while self.due and self.due[0][0] <= until:
            at, _, request_id, i = heapq.heappop(self.due)
            self.clicks.write({"request_id": request_id, "instance": i, "time": round(at, 3)})

    def run(self) -> None:
        t0 = time.time()
        period = 1.0 / self.a.rate
        while (elapsed := time.time() - t0) < self.a.duration:
            self.send(self.a.instances, self.day(elapsed))
            self.flush(time.time())
            pause = t0 + self.sent * period - time.time()
            if pause > 0:
                time.sleep(pause)
        end = time.time() + self.a.drain_s
        while self.due and time.time() < end:  # clicks still on their way
            self.flush(time.time())
            time.sleep(0.2)
        self.clicks.close()
        if self.truth is not None:
            self.truth.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.demos.simulate", description=__doc__.splitlines()[0]
    )
    p.add_argument("--url", default="http://127.0.0.1:8501", help="the server's REST address")
    p.add_argument("--model", default="ctr", help="model name (default ctr)")
    p.add_argument("--clicks-dir", type=Path, required=True, help="folder the click events go to")
    p.add_argument("--truth-dir", type=Path, help="also write each request's true click probabilities here")
    p.add_argument("--start-day", type=float, default=0.0, help="world time at the start (days, default 0)")
    p.add_argument("--end-day", type=float, default=1.0, help="world time at the end (days, default 1)")
    p.add_argument(
        "--duration", type=float, default=60.0, help="wall seconds from start to end day (default 60)"
    )
    p.add_argument("--rate", type=float, default=10.0, help="requests per second (default 10)")
    p.add_argument("--instances", type=int, default=8, help="rows per request (default 8)")
    p.add_argument("--drift-scale", type=float, default=1.0, help="drift speed multiplier (default 1)")
    p.add_argument("--click-delay-s", type=float, default=2.0, help="mean click delay in seconds (default 2)")
    p.add_argument(
        "--duplicate-rate", type=float, default=0.01, help="share of clicks sent twice (default 0.01)"
    )
    p.add_argument(
        "--drain-s", type=float, default=10.0, help="after the end, keep writing due clicks this long"
    )
    p.add_argument("--seed", type=int, default=1, help="sampling seed (also names the files and request ids)")
    p.add_argument("--summary", type=Path, help="also write the counts here as JSON (default: none)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        args.rate <= 0
        or args.duration <= 0
        or args.instances < 1
        or args.end_day < args.start_day
        or args.start_day < 0
    ):
        print(
            "simulate: error: need --rate > 0, --duration > 0, --instances >= 1 and 0 <= --start-day <= --end-day, "
            f"got {args.rate:g}, {args.duration:g}, {args.instances}, {args.start_day:g}..{args.end_day:g}",
            file=sys.stderr,
        )
        return 2
    sim = Simulator(args)
    # SIGINT or SIGTERM ends the run early with its counts. Both are set here: a process that a shell started in
    # the background inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        sim.run()
    except KeyboardInterrupt:  # stopped early: the counts so far
        sim.clicks.close()
    if args.summary:
        summary: dict[str, object] = {"sent": sim.sent, "failed": sim.failed, "rows": sim.rows}
        summary["clicks"] = sim.clicks.written
        summary |= {"errors": dict(sim.errors), "answered_by": dict(sim.answered_by)}
        args.summary.write_text(json.dumps(summary) + "\n")
    print(
        f"simulate: sent {sim.sent} requests ({sim.failed} failed, {sim.rows} rows), wrote {sim.clicks.written} "
        f"click events to {args.clicks_dir}; world days {args.start_day:g}..{args.end_day:g} x{args.drift_scale:g}"
    )
    return 0 if sim.sent > sim.failed else 1


if __name__ == "__main__":
    sys.exit(main())
