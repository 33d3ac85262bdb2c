"""`python -m pipelines.clicks.request_log_rows`: the server's sampled request logs + clicks -> a Criteo training file."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from ctr_features.criteo import read_batches


def test_logs_joined_with_clicks_become_a_criteo_file(
    tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    row = {f"I{i}": i for i in range(1, 14)} | {f"C{i}": f"{i:08x}" for i in range(1, 27)}
    sparse = {"I1": None, "I2": -1, "C1": "", "C3": "68fd1e64"}  # missing cells: null, "" or absent
    entries = [
        {"request_id": "a", "inputs": {"instances": [row, sparse]}, "outputs": [[0.3], [0.1]]},
        {
            "request_id": "b",
            "inputs": {"inputs": {"I5": [7, None], "C2": ["x", "y"]}},
            "outputs": [[0.2], [0.4]],
        },
        {"request_id": "c", "inputs": {"instances": [[0.1] * 128]}, "outputs": [[0.5]]},  # features: skipped
        {"request_id": "a", "inputs": {"instances": [row]}, "outputs": [[0.3]]},  # a retry: counted once
    ]
    text = "".join(json.dumps(e) + "\n" for e in entries) + '{"request_id": "d", "inp'  # cut by a full disk
    (logs / "requests-1-1.jsonl").write_text(text)
    clicks = tmp_path / "clicks.tsv"
    clicks.write_text("a\nb\t1\n")
    out = tmp_path / "day.txt"
    proc = run_module(
        "pipelines.clicks.request_log_rows", "--logs", logs, "--clicks", clicks, "--out", out, check=True
    )
    assert proc.stdout.strip() == (
        f"wrote 4 rows (2 clicked) from 2 requests in 1 files to {out}; skipped 1 repeated request id, "
        "1 request without raw fields, 1 unreadable line"
    )
    lines = out.read_text().splitlines()
    assert lines[0] == "\t".join(["1", *map(str, range(1, 14)), *(f"{i:08x}" for i in range(1, 27))])
    assert lines[1] == "\t".join(["0", "", "-1", *[""] * 11, "", "", "68fd1e64", *[""] * 23])
    assert lines[2] == "\t".join(["0", *[""] * 4, "7", *[""] * 8, "", "x", *[""] * 24])
    assert lines[3] == "\t".join(["1", *[""] * 13, "", "y", *[""] * 24])
    assert sum(len(b) for b in read_batches(out)) == 4  # the strict training reader takes the file
