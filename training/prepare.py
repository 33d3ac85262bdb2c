"""Prepare data for training ahead of it: `python -m training.prepare --data PATH [--cache-dir DIR]`.

Parses the text into Parquet, fits the FeatureSpec and encodes every row, exactly as a training run would,
and prints the rows/s of each step. A training run on the same data and settings then starts at once.
Under torchrun every rank prepares its share (see `training/data/preparation.py`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ctr_contract.cli_help import DefaultsHelpFormatter
from training.config import TrainConfig
from training.errors import TrainingError


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m training.prepare",
        description=__doc__.splitlines()[0],
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--data", default=d.data, help=f"as for training, s3:// too (default: {d.data})")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="folder for caches and prepared records (default: beside the data when writable, "
        "else $XDG_CACHE_HOME/ctr-pipeline or ~/.cache/ctr-pipeline)",
    )
    p.add_argument(
        "--skip-bad-rows", action="store_true", help="count and skip malformed rows (default: off)"
    )
    p.add_argument("--max-rows", type=int, default=None, help="use only the first N rows (default: all rows)")
    p.add_argument("--val-fraction", type=float, default=d.val_fraction, help="validation share")
    p.add_argument("--width", type=int, default=d.width, help="feature vector width")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the data is prepared, 1 on bad data, 2 on invalid options."""
    args = build_parser().parse_args(argv)
    try:
        TrainConfig(data=args.data, max_rows=args.max_rows, val_fraction=args.val_fraction, width=args.width)
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from training.data.preparation import prepare_data
    from training.data.rank_group import launched_group

    start = time.perf_counter()
    try:
        with launched_group() as group:
            say = print if group.rank == 0 else (lambda _: None)
            out = prepare_data(
                args.data,
                args.cache_dir,
                args.val_fraction,
                args.width,
                args.max_rows,
                args.skip_bad_rows,
                say,
                group=group,
            )
    except (TrainingError, OSError) as e:
        if isinstance(e, OSError) and not isinstance(e, TrainingError) and e.filename is None:
            raise  # not a file the user named: a bug, with its traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    if group.rank == 0:
        if not out.timings:
            print(f"already prepared in {out.cache_dir}: reused")
        print(
            f"prepared {out.report.summary()} in {time.perf_counter() - start:.2f}s with {group.world} rank(s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
