"""`python -m pipelines.clicks`: request logs x clicks -> Parquet partitions, one per interval (pipelines/clicks/join.py).

    python -m pipelines.clicks --logs LOGS --clicks CLICKS --out DATA --start 2026-11-30T08:00:00Z --end ...

Writes DATA/train/interval-N.parquet and DATA/holdout/interval-N.parquet for every interval of --interval-s
seconds (aligned to the Unix epoch) in [--start, --end); `python -m training --data DATA/train` reads them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ctr_contract.ratelog import RateLimitedLog
from pipelines.clicks.events import parse_time
from pipelines.clicks.join import join_interval


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.clicks", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument("--logs", type=Path, required=True, help="request log folder")
    p.add_argument("--clicks", type=Path, required=True, help="click events folder")
    p.add_argument("--out", type=Path, required=True, help="output folder (train/ and holdout/ partitions)")
    p.add_argument("--start", type=parse_time, required=True, help="Unix seconds or ISO 8601")
    p.add_argument("--end", type=parse_time, required=True, help="Unix seconds or ISO 8601")
    p.add_argument("--interval-s", type=float, default=3600.0, help="seconds per partition (default 3600)")
    p.add_argument("--window-s", type=float, default=1800.0, help="attribution window (default 1800)")
    p.add_argument("--holdout", type=float, default=0.2, help="share of requests held out (default 0.2)")
    args = p.parse_args(argv)
    if args.end <= args.start or args.interval_s <= 0 or args.window_s < 0:
        p.error(f"need --end > --start, --interval-s > 0 and --window-s >= 0, got {args}")
    logging.basicConfig(level=logging.INFO, format="join: %(message)s", stream=sys.stdout)
    ratelog = RateLimitedLog(logging.getLogger("pipelines.clicks"))
    first, last = int(args.start // args.interval_s), int(-(-args.end // args.interval_s))
    for j in range(first, last):
        start = j * args.interval_s
        r = join_interval(
            args.logs, args.clicks, args.out, j, start, start + args.interval_s, args.window_s, args.holdout
        )
        for kind, n in r.counts.items():
            if kind != "clicks":
                ratelog.count(kind, n, "counted and dropped")
        print(
            f"interval {j}: {r.rows} rows ({r.positives} clicked, {r.holdout_rows} held out) from {r.requests} requests; {r.counts}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
