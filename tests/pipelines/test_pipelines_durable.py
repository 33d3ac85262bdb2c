"""pipelines/durable.py: a whole-file replace, an appended JSON line and a cut back to a recorded length."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.durable import append_line, cut, replace_file


def test_replace_file_writes_the_text_keeps_the_mode_and_leaves_no_temporary(tmp_path: Path):
    path = tmp_path / "a" / "config"
    replace_file(path, "one\n", mode=0o600)
    replace_file(path, "two\n")
    assert path.read_text() == "two\n" and path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["config"]


def test_append_line_returns_the_length_that_cut_goes_back_to(tmp_path: Path):
    path = tmp_path / "history.jsonl"
    first = append_line(path, {"b": 1, "a": [2]})
    assert first == path.stat().st_size and path.read_text() == '{"a": [2], "b": 1}\n'
    append_line(path, {"interval": 2})
    cut(path, first)  # the second line's interval was never recorded
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": [2], "b": 1}]
    cut(path, first + 100)  # never longer
    cut(tmp_path / "none.jsonl", 0)  # nor created
    assert path.stat().st_size == first and not (tmp_path / "none.jsonl").exists()
