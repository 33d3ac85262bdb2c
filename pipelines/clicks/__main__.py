"""`python -m pipelines.clicks`: the click join, request logs x clicks -> training rows.

    python -m pipelines.clicks --logs LOGS --clicks CLICKS --out DATA --start 2026-11-30T08:00:00Z --end ...
    python -m pipelines.clicks --format criteo --logs LOG_DIR --clicks clicks.tsv --out day7.txt

By interval (`--format parquet`, the default): writes DATA/train/interval-N.parquet,
DATA/holdout/interval-N.parquet and DATA/shadow/interval-N.parquet (shadow scores) for every interval of --interval-s seconds (aligned to the Unix epoch) in
[--start, --end), each request labelled by the click events (a folder) within --window-s of it;
`python -m training --data DATA/train` reads them.

Whole logs (`--format criteo`): every request of the logs (folders or files), labelled by a click list (one
click per line: REQUEST_ID[<TAB>INSTANCE]), written as one Kaggle train.txt file, the input of
`python -m training --data FILE` (docs/daily-loop.md). Both modes are pipelines/clicks/join.py's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ctr_contract.ratelog import RateLimitedLog
from pipelines.clicks.events import parse_time
from pipelines.clicks.join import join_interval, join_logs

INTERVAL_DEFAULTS = {"interval_s": 3600.0, "window_s": 1800.0, "holdout": 0.2}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.clicks", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument(
        "--format",
        choices=("parquet", "criteo"),
        default="parquet",
        help="parquet: Parquet partitions by interval, with an attribution window (default); "
        "criteo: whole logs x a click list -> one Criteo text file",
    )
    p.add_argument(
        "--logs",
        type=Path,
        nargs="+",
        required=True,
        help="request log folder (criteo: folders or .jsonl files)",
    )
    p.add_argument(
        "--clicks",
        type=Path,
        required=True,
        help="click events folder (criteo: one click per line: REQUEST_ID[<TAB>INSTANCE])",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output folder of train/ and holdout/ partitions (criteo: the Criteo file to write)",
    )
    p.add_argument("--start", type=parse_time, help="Unix seconds or ISO 8601 (parquet only)")
    p.add_argument("--end", type=parse_time, help="Unix seconds or ISO 8601 (parquet only)")
    p.add_argument("--interval-s", type=float, help="seconds per partition (default 3600; parquet only)")
    p.add_argument("--window-s", type=float, help="attribution window (default 1800; parquet only)")
    p.add_argument("--holdout", type=float, help="share of requests held out (default 0.2; parquet only)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.format == "criteo":
        given = [
            f"--{k.replace('_', '-')}"
            for k in ("start", "end", *INTERVAL_DEFAULTS)
            if getattr(args, k) is not None
        ]
        if given:
            p.error(f"--format criteo joins whole logs: no {', '.join(given)}")
        return _criteo(args.logs, args.clicks, args.out)
    missing = [f"--{k}" for k in ("start", "end") if getattr(args, k) is None]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")
    if len(args.logs) != 1:
        p.error("--format parquet reads one request log folder")
    for k, v in INTERVAL_DEFAULTS.items():
        setattr(args, k, v if getattr(args, k) is None else getattr(args, k))
    if args.end <= args.start or args.interval_s <= 0 or args.window_s < 0:
        p.error(f"need --end > --start, --interval-s > 0 and --window-s >= 0, got {args}")
    return _intervals(args)


def _intervals(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="join: %(message)s", stream=sys.stdout)
    ratelog = RateLimitedLog(logging.getLogger("pipelines.clicks"))
    first, last = int(args.start // args.interval_s), int(-(-args.end // args.interval_s))
    for j in range(first, last):
        start = j * args.interval_s
        r = join_interval(
            args.logs[0],
            args.clicks,
            args.out,
            j,
            start,
            start + args.interval_s,
            args.window_s,
            args.holdout,
        )
        for kind, n in r.counts.items():
            if kind != "clicks":
                ratelog.count(kind, n, "counted and dropped")
        print(
            f"interval {j}: {r.rows} rows ({r.positives} clicked, {r.holdout_rows} held out) from {r.requests} "
            f"requests, {r.shadow_rows} shadow rows; {r.counts}"
        )
    return 0


def _criteo(logs: list[Path], clicks: Path, out: Path) -> int:
    try:
        report = join_logs(logs, clicks, out)
    except (OSError, ValueError) as e:
        print(f"request_log_to_criteo: error: {e}", file=sys.stderr)
        return 1
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.kinds.items())) or "nothing"
    print(
        f"wrote {report.rows} rows ({report.clicks} clicked) from {report.requests} requests in {report.files} "
        f"files to {out}; skipped {skipped}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
