"""Compare two bench runs figure by figure: `python -m bench.compare A B` (dirs or results.json files).

For each figure both runs hold it prints A, B and B/A, and whether B is better or worse than A
(beyond a 5% noise band): lower is better for latencies, higher for throughputs and AUC.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.report.measurements import flatten, higher_is_better

NOISE = 0.05  # relative change below which two runs count as the same


class CompareError(ValueError):
    """A path that holds no readable bench results."""


def load_results(path: Path) -> dict[str, Any]:
    """A run's results dict, from its directory or its results.json."""
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        raise CompareError(
            f"no bench results at {path}: expected a bench/results/<timestamp> dir or its results.json"
        )
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CompareError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(data, dict) or "sections" not in data:
        raise CompareError(f"{file} is not a bench results file (no 'sections' key)")
    return data


def verdict(name: str, ratio: float) -> str:
    """'better', 'worse' or 'same' for B relative to A, given the direction of the figure."""
    if abs(ratio - 1.0) < NOISE:
        return "same"
    improved = ratio > 1.0 if higher_is_better(name) else ratio < 1.0
    return "better" if improved else "worse"


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, float, float, float | None, str]]:
    """(figure, A, B, B/A, verdict) for every figure both runs hold, in name order."""
    fa, fb = flatten(a), flatten(b)
    rows = []
    for name in sorted(fa.keys() & fb.keys()):
        va, vb = fa[name], fb[name]
        ratio = vb / va if va else None
        rows.append((name, va, vb, ratio, "n/a" if ratio is None else verdict(name, ratio)))
    return rows


def render(a_label: str, b_label: str, a: dict[str, Any], b: dict[str, Any]) -> str:
    """The comparison as a text table, plus the figures only one run holds."""
    rows = compare(a, b)
    width = max([len(r[0]) for r in rows] + [len("figure")])
    lines = [
        f"A = {a_label} ({a.get('mode')}, {a.get('started_at')})",
        f"B = {b_label} ({b.get('mode')}, {b.get('started_at')})",
        "",
    ]
    lines.append(f"{'figure':<{width}}  {'A':>12}  {'B':>12}  {'B/A':>7}  verdict")
    for name, va, vb, ratio, word in rows:
        ratio_text = "–" if ratio is None else f"{ratio:.3f}"
        lines.append(f"{name:<{width}}  {va:>12.4g}  {vb:>12.4g}  {ratio_text:>7}  {word}")
    only_a = sorted(flatten(a).keys() - flatten(b).keys())
    only_b = sorted(flatten(b).keys() - flatten(a).keys())
    if only_a:
        lines += ["", f"only in A ({len(only_a)}): " + ", ".join(only_a)]
    if only_b:
        lines += ["", f"only in B ({len(only_b)}): " + ", ".join(only_b)]
    if not rows:
        lines += ["", "the two runs share no figure"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("a", type=Path, help="the reference run (dir or results.json)")
    parser.add_argument("b", type=Path, help="the run compared against it")
    args = parser.parse_args(argv)
    try:
        a, b = load_results(args.a), load_results(args.b)
    except CompareError as e:
        print(f"bench.compare: {e}", file=sys.stderr)
        return 2
    print(render(str(args.a), str(args.b), a, b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
