"""`python -m pipelines.clicks.request_log_rows`: sampled request logs + clicks -> a Criteo training file.

    python -m pipelines.clicks.request_log_rows --logs LOG_DIR --clicks clicks.tsv --out day7.txt

Every instance of every logged request becomes one row: label 1 when the clicks file names it, else 0.
Only requests that carry the raw Criteo fields (the `raw` signature: I1..I13, C1..C26 by name, in row or
columnar form) can become rows; requests logged as engineered feature vectors are counted and skipped.

The clicks file holds one click per line: `REQUEST_ID` (the first instance) or `REQUEST_ID<TAB>INSTANCE`
(0-based), e.g. from the click tracker that received the `x-request-id` the server returned. A request id
logged twice (a retry) counts once. A partly written last line (a disk that filled up) is skipped.
The output is Kaggle train.txt form, the input of `python -m training --data FILE` (docs/daily-loop.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS, RAW_FIELDS


@dataclass
class Report:
    """What a conversion read, wrote and skipped."""

    files: int = 0
    requests: int = 0
    rows: int = 0
    clicks: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def read_clicks(path: Path) -> set[tuple[str, int]]:
    """(request id, instance) of every click."""
    clicks = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.strip().split("\t")
        if not parts[0]:
            continue
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError(f"{path}:{number}: expected REQUEST_ID or REQUEST_ID<TAB>INSTANCE, got {line!r}")
        clicks.add((parts[0], int(parts[1]) if len(parts) == 2 else 0))
    return clicks


def raw_rows(inputs: Any) -> list[dict[str, Any]] | None:
    """The logged inputs as one dict per instance, or None when they are not raw Criteo fields."""
    if isinstance(inputs, dict) and isinstance(inputs.get("instances"), list):
        rows = inputs["instances"]
        return rows if rows and all(isinstance(r, dict) and set(r) <= set(RAW_FIELDS) for r in rows) else None
    columns = inputs.get("inputs") if isinstance(inputs, dict) else None
    if isinstance(columns, dict) and columns and set(columns) <= set(RAW_FIELDS):
        lengths = {len(v) for v in columns.values() if isinstance(v, list)}
        if len(lengths) == 1 and len(columns) == sum(isinstance(v, list) for v in columns.values()):
            return [{k: v[i] for k, v in columns.items()} for i in range(lengths.pop())]
    return None


def criteo_line(label: int, row: dict[str, Any]) -> str:
    """One Kaggle train.txt line; missing cells (absent, null, NaN, "") are empty."""
    cells = [str(label)]
    for f in NUMERIC_FIELDS:
        v = row.get(f)
        cells.append("" if v is None or v == "" or (isinstance(v, float) and math.isnan(v)) else str(int(v)))
    cells += ["" if row.get(f) is None else str(row[f]) for f in CATEGORICAL_FIELDS]
    return "\t".join(cells)


def log_files(paths: list[Path]) -> Iterator[Path]:
    for p in paths:
        yield from sorted(p.glob("requests-*.jsonl")) if p.is_dir() else [p]


def convert(logs: list[Path], clicks_file: Path, out: Path) -> Report:
    """Join the logs with the clicks and write `out`; returns the report."""
    clicks = read_clicks(clicks_file)
    report, seen = Report(), set()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w") as sink:
        for path in log_files(logs):
            report.files += 1
            for line in path.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                    request_id = entry["request_id"]
                except (ValueError, KeyError, TypeError):
                    report.skip("unreadable line")
                    continue
                if request_id in seen:
                    report.skip("repeated request id")
                    continue
                seen.add(request_id)
                rows = raw_rows(entry.get("inputs"))
                if rows is None:
                    report.skip("request without raw fields")
                    continue
                report.requests += 1
                for i, row in enumerate(rows):
                    label = int((request_id, i) in clicks)
                    sink.write(criteo_line(label, row) + "\n")
                    report.rows += 1
                    report.clicks += label
    tmp.replace(out)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.clicks.request_log_rows", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--logs", type=Path, nargs="+", required=True, help="log directories or .jsonl files")
    parser.add_argument(
        "--clicks", type=Path, required=True, help="one click per line: REQUEST_ID[<TAB>INSTANCE]"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="Criteo file to write (Kaggle train.txt form)"
    )
    args = parser.parse_args(argv)
    try:
        report = convert(args.logs, args.clicks, args.out)
    except (OSError, ValueError) as e:
        print(f"request_log_to_criteo: error: {e}", file=sys.stderr)
        return 1
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())) or "nothing"
    print(
        f"wrote {report.rows} rows ({report.clicks} clicked) from {report.requests} requests in {report.files} "
        f"files to {args.out}; skipped {skipped}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
