"""Line and branch coverage per package of ours, from a combined coverage.py data file (make coverage).

    python scripts/coverage_table.py DATA_FILE   # prints a Markdown table: package, lines, branches, total

"total" is coverage.py's own figure: covered lines and branches over all lines and branches.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from collections import defaultdict
from pathlib import Path

# The packages coverage measures: pyproject.toml's [tool.coverage.run] source, the one list.
PACKAGES = tuple(
    tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["tool"]["coverage"][
        "run"
    ]["source"]
)


def main(data_file: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        subprocess.run(
            [sys.executable, "-m", "coverage", "json", "-q", f"--data-file={data_file}", "-o", str(out)],
            check=True,
        )
        files = json.loads(out.read_text())["files"]
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # statements, covered, branches, covered
    for path, f in files.items():
        package = Path(path).parts[0] if not Path(path).is_absolute() else _package(Path(path))
        s = f["summary"]
        for key in (package, "all"):
            row = sums[key]
            row[0] += s["num_statements"]
            row[1] += s["covered_lines"]
            row[2] += s["num_branches"]
            row[3] += s["covered_branches"]
    print("| package | lines | branches | total |")
    print("|---|---|---|---|")
    for key in (*PACKAGES, "all"):
        st, cl, br, cb = sums[key]
        if st == 0:
            continue
        print(
            f"| {key} | {100 * cl / st:.1f}% of {st} | {100 * cb / max(br, 1):.1f}% of {br} | "
            f"{100 * (cl + cb) / (st + br):.1f}% |"
        )
    return 0


def _package(path: Path) -> str:
    for part in path.parts:
        if part in PACKAGES:
            return part
    return "other"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
