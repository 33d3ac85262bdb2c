"""`python -m bench`: the framework comparison (training, in-process inference, serving) on this machine.

Writes bench/results/<UTC timestamp>/{report.md, results.json, *.png, logs/}. Exit code 0 when every
section was measured, 1 when some failed (the report says why), 2 when none was, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.harness.inputs import PROJECT_ROOT
from bench.harness.modes import MODES, SECTIONS, get_mode
from bench.harness.procs import install_cleanup
from bench.harness.suite import run_bench
from bench.report.measurements import flatten

RESULTS_ROOT = PROJECT_ROOT / "bench" / "results"


def parse_sections(text: str) -> list[str]:
    """`training,serving` -> ["training", "serving"], or a ValueError naming the valid sections."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown sections {unknown or text!r}; expected a comma list of {SECTIONS}"
        )
    return [s for s in SECTIONS if s in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mode",
        default="full",
        choices=sorted(MODES),
        help="full (default), quick (~10 min) or tiny (tests)",
    )
    parser.add_argument(
        "--sections", type=parse_sections, default=list(SECTIONS), help=f"comma list of {','.join(SECTIONS)}"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results dir (default bench/results/<UTC timestamp>)"
    )
    parser.add_argument(
        "--keep-work", action="store_true", help="keep the generated data, checkpoint and model repository"
    )
    args = parser.parse_args(argv)
    mode = get_mode(args.mode)
    out_dir = args.out or RESULTS_ROOT / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    install_cleanup()
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    print(f"[bench] mode {mode.name}, sections {','.join(args.sections)} → {out_dir}", flush=True)
    results = run_bench(mode, out_dir, args.sections, keep_work=args.keep_work, command=command)
    for name, sec in results["sections"].items():
        reason = "" if sec["status"] == "ok" else ": " + str(sec.get("reason", "")).splitlines()[0]
        print(f"[bench] {name}: {sec['status']}{reason}")
    print(
        f"[bench] {len(flatten(results))} figures in {results['wall_seconds']:.0f} s; report: {out_dir / 'report.md'}"
    )
    return int(results["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
