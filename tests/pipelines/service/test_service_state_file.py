"""A typed state file: a dataclass as JSON, replaced whole, refused when made with other settings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipelines.service.state_file import StateFile


@dataclass
class Counter:
    interval_s: float
    model: str
    next: int = 0
    seen: list[int] = field(default_factory=list)


def _file(tmp_path: Path) -> StateFile[Counter]:
    return StateFile(tmp_path / "state" / "state.json", Counter, "a counter state")


def test_a_saved_state_loads_back_equal_and_is_sorted_indented_json(tmp_path: Path):
    f = _file(tmp_path)
    assert f.load() is None
    f.save(Counter(10.0, "ctr", 7, [5, 6]))
    assert f.load() == Counter(10.0, "ctr", 7, [5, 6])
    assert (
        f.path.read_text()
        == json.dumps({"interval_s": 10.0, "model": "ctr", "next": 7, "seen": [5, 6]}, indent=1) + "\n"
    )
    assert [p.name for p in f.path.parent.iterdir()] == ["state.json"]  # no temporary left behind


@pytest.mark.parametrize(
    "text", ["{not json", '{"interval_s": 1.0}', '{"interval_s": 1, "model": "m", "x": 2}']
)
def test_a_file_that_holds_no_state_is_refused_with_its_path(tmp_path: Path, text: str):
    f = _file(tmp_path)
    f.path.parent.mkdir()
    f.path.write_text(text)
    with pytest.raises(
        ValueError, match=f"^{f.path} is not a counter state .*; move it away to start afresh$"
    ):
        f.load()


def test_open_saves_the_fresh_state_when_there_is_none(tmp_path: Path):
    f = _file(tmp_path)
    state = f.open(Counter(10.0, "ctr", 3), {"interval_s": "--interval-s"}, "counted", "a new --state-dir")
    assert state == Counter(10.0, "ctr", 3) == f.load()


def test_open_keeps_the_saved_state_when_its_settings_are_the_same(tmp_path: Path):
    f = _file(tmp_path)
    f.save(Counter(10.0, "ctr", 9, [8]))
    state = f.open(Counter(10.0, "ctr", 3), {"interval_s": "--interval-s"}, "counted", "a new --state-dir")
    assert state == Counter(10.0, "ctr", 9, [8])


def test_open_refuses_a_state_made_with_other_settings_naming_flags_and_fix(tmp_path: Path):
    f = _file(tmp_path)
    f.save(Counter(10.0, "ctr", 9))
    fixed = {"interval_s": "--interval-s", "model": "--model"}
    with pytest.raises(ValueError) as e:
        f.open(Counter(60.0, "ctr", 0), fixed, "counted", "a new --state-dir")
    assert str(e.value) == (
        f"{f.path.parent} was counted with --interval-s 10 --model 'ctr', not 60 and 'ctr'; "
        "use those or a new --state-dir"
    )
    assert f.load() == Counter(10.0, "ctr", 9)  # untouched
