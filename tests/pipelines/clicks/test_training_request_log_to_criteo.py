"""`python -m pipelines.clicks --format criteo`: the server's sampled request logs + a click list -> a Criteo
training file (the click join over whole logs, pipelines/clicks/join.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ctr_features.data.criteo import read_batches
from pipelines.clicks.__main__ import main

ROW = {f"I{i}": i for i in range(1, 14)} | {f"C{i}": f"{i:08x}" for i in range(1, 27)}


def test_logs_joined_with_clicks_become_a_criteo_file(
    tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    row = ROW
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
        "pipelines.clicks",
        "--format",
        "criteo",
        "--logs",
        logs,
        "--clicks",
        clicks,
        "--out",
        out,
        check=True,
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


def _log(path: Path, *request_ids: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"request_id": r, "inputs": {"instances": [ROW]}}) + "\n" for r in request_ids)
    )


def test_one_folder_per_pod_and_files_named_are_all_read(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # k8s serving pods each write --request_log_dir=/var/log/ctr/$(POD_NAME): the day's data reads them all.
    _log(tmp_path / "logs" / "ctr-serving-a" / "requests-1-1.jsonl", "a")
    _log(tmp_path / "logs" / "ctr-serving-b" / "requests-1-1.jsonl", "b", "a")
    _log(tmp_path / "other.jsonl", "c")
    (tmp_path / "clicks.tsv").write_text("b\n")
    out = tmp_path / "day.txt"
    args = ["--format", "criteo", "--clicks", str(tmp_path / "clicks.tsv"), "--out", str(out)]
    assert main([*args, "--logs", str(tmp_path / "logs"), str(tmp_path / "other.jsonl")]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote 3 rows (1 clicked) from 3 requests in 3 files to {out}; skipped 1 repeated request id"
    )
    assert [line.split("\t")[0] for line in out.read_text().splitlines()] == ["0", "1", "0"]


def test_a_bad_click_list_is_an_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _log(tmp_path / "logs" / "requests-1-1.jsonl", "a")
    (tmp_path / "clicks.tsv").write_text("a\nb\tfirst\n")
    out = tmp_path / "day.txt"
    rc = main(
        [
            "--format",
            "criteo",
            "--logs",
            str(tmp_path / "logs"),
            "--clicks",
            str(tmp_path / "clicks.tsv"),
            "--out",
            str(out),
        ]
    )
    assert rc == 1 and not out.exists()
    assert capsys.readouterr().err.strip() == (
        f"request_log_to_criteo: error: {tmp_path / 'clicks.tsv'}:2: expected REQUEST_ID or "
        "REQUEST_ID<TAB>INSTANCE, got 'b\\tfirst'"
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--logs", "a", "--format", "criteo", "--start", "0", "--window-s", "60"],
            "--format criteo joins whole logs: no --start, --window-s",
        ),
        (["--logs", "a"], "the following arguments are required: --start, --end"),
        (["--logs", "a", "--end", "100"], "the following arguments are required: --start"),
        (
            ["--logs", "a", "b", "--start", "0", "--end", "100"],
            "--format parquet reads one request log folder",
        ),
    ],
)
def test_each_mode_takes_only_its_own_flags(
    args: list[str], error: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--clicks", "c", "--out", "o"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"python -m pipelines.clicks: error: {error}")
