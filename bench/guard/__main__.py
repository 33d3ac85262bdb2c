"""`python -m bench.guard` (`make bench-guard`): HEAD against the commit `bench/baseline` names, or fail.

    python -m bench.guard [--head-tree DIR] [--baseline COMMIT] [--rounds 6] [--seconds 3] [--out DIR]

Interleaved rounds on both sides (bench/guard/rounds.py), then one table: each figure's median and spread per
side, the paired ratio and the verdict (bench/guard/verdict.py has the rule). Exit 0 when no figure fails, 1
when one does, 2 when the guard could not measure. The table and every round's values go to `--out`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.guard.rounds import FIGURES, Rounds, measure_rounds
from bench.guard.trees import (
    BASELINE_FILE,
    GUARD_DIR,
    baseline_commit,
    baseline_tree,
    build_extensions,
    fixture,
    imported_from,
)
from bench.guard.verdict import TOLERANCE, judge, table
from bench.harness import procs
from bench.harness.inputs import PROJECT_ROOT
from bench.harness.servers import base_path_of

HEAD, BASELINE = "HEAD", "baseline"


def describe(tree: Path) -> str:
    """The tree's commit, and whether it has uncommitted changes (they are measured too)."""
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    status = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "-uno"], capture_output=True, text=True
    )
    dirty = " with uncommitted changes" if status.stdout.strip() else ""
    return f"{commit.stdout.strip() or '(not a git tree)'}{dirty}"


def report(rounds: Rounds, header: list[str]) -> tuple[str, bool]:
    """The printed report and whether HEAD failed (a figure worse beyond the rule, or an error answered)."""
    verdicts = [judge(f, rounds.values[f.name][HEAD], rounds.values[f.name][BASELINE]) for f in FIGURES]
    errors = {side: n for side, n in rounds.errors.items() if n}
    failed = any(v.failed for v in verdicts) or bool(errors.get(HEAD))
    lines = [*header, "", table(verdicts), ""]
    if errors:
        lines.append(f"failed responses counted by wrk: {errors}")
    worst = min(verdicts, key=lambda v: v.ratio - v.threshold)
    lines.append(
        f"{'FAILED' if failed else 'passed'}: HEAD fails a figure when its ratio to the baseline is below "
        f"1 - ({TOLERANCE:.0%} + the ratio's spread); closest: {worst.figure.name} at {worst.ratio:.3f} "
        f"against {worst.threshold:.3f}"
    )
    return "\n".join(lines), failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.guard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--head-tree", type=Path, default=PROJECT_ROOT, help="the tree measured as HEAD (default: this one)"
    )
    parser.add_argument(
        "--baseline", help=f"the baseline commit (default: the one {BASELINE_FILE.name} names)"
    )
    parser.add_argument(
        "--rounds", type=int, default=6, help="interleaved rounds (default 6: 3 in each order)"
    )
    parser.add_argument("--seconds", type=int, default=3, help="seconds of each measured wrk run (default 3)")
    parser.add_argument(
        "--out",
        type=Path,
        help="where report.md and rounds.json go (default artifacts/bench-guard/runs/<UTC>)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    # Absolute: each side's commands run in their own tree.
    out = (args.out or GUARD_DIR / "runs" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")).resolve()
    procs.install_cleanup()
    try:
        commit = baseline_commit() if args.baseline is None else args.baseline
        head_tree = args.head_tree.resolve()
        print(f"[bench-guard] baseline {commit}: worktree and fixture (made once a commit)", flush=True)
        trees = {HEAD: head_tree, BASELINE: baseline_tree(commit)}
        build_extensions(head_tree, out / "build_head.log")
        made = fixture(commit, trees[BASELINE])
        header = [f"# bench-guard {datetime.now(UTC).isoformat(timespec='seconds')}", ""]
        for side, tree in trees.items():
            header.append(f"- {side}: {tree} at {describe(tree)}; imports {imported_from(tree)}")
        print("\n".join(header), flush=True)
        found = measure_rounds(
            trees, base_path_of(made.model_base_path), made.data, out / "work", args.rounds, args.seconds
        )
    except (procs.StepError, ValueError, RuntimeError, TimeoutError, OSError) as e:
        print(f"[bench-guard] could not measure: {e}", file=sys.stderr)
        return 2
    header.append(
        f"- {args.rounds} rounds, {args.seconds} s a side a point in 1 s wrk runs; one worker, batching on, "
        "--intra_op_threads=1"
    )
    text, failed = report(found, header)
    text += f"\nwall time {time.monotonic() - started:.0f} s"
    print(text)
    (out / "report.md").write_text(text + "\n")
    (out / "rounds.json").write_text(json.dumps({"values": found.values, "errors": found.errors}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
