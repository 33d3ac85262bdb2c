"""The shared flags (names and defaults the services keep) and `run_service`'s exit codes."""

from __future__ import annotations

import argparse
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.clicks.events import parse_time
from pipelines.service.clock import IntervalClock
from pipelines.service.flags import (
    add_clock_flags,
    add_metrics_flags,
    add_run_flags,
    clock_problems,
    run_service,
    settings,
)
from pipelines.service.loop import Stop


def _parser(intervals: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_clock_flags(p, 10.0, "--attribution-window-s", 60.0, "a click counts this long after its request")
    add_run_flags(p, "evaluated", parse_time, intervals=intervals)
    add_metrics_flags(p, 9108)
    return p


def test_the_flags_keep_each_services_names_and_defaults():
    assert vars(_parser(intervals=True).parse_args([])) == {
        "interval_s": 10.0,
        "attribution_window_s": 60.0,
        "start": None,
        "until": None,
        "intervals": None,
        "metrics_port": 9108,
        "metrics_host": "0.0.0.0",
    }
    args = _parser(intervals=False).parse_args(["--until", "2026-12-01T00:00:10Z", "--start", "1796083200"])
    assert (args.start, args.until, "intervals" in vars(args)) == (1796083200.0, 1796083210.0, False)


def test_clock_problems_name_the_flags_and_values():
    assert clock_problems(IntervalClock(10.0, 0.0), "--window-s") == []
    assert clock_problems(IntervalClock(0.0, 5.0), "--window-s") == [
        "need --interval-s > 0 and --window-s >= 0, got 0, 5"
    ]
    assert clock_problems(IntervalClock(10.0, -1.0), "--attribution-window-s") == [
        "need --interval-s > 0 and --attribution-window-s >= 0, got 10, -1"
    ]


def test_run_service_returns_1_with_the_error_for_a_listed_error_and_0_otherwise(
    capsys: pytest.CaptureFixture,
):
    before = signal.getsignal(signal.SIGTERM)

    def fails(stop: Stop) -> None:
        assert signal.getsignal(signal.SIGTERM) is not before  # SIGTERM asks the stop while running
        raise ValueError("/state was trained with --interval-s 10")

    assert run_service("svc", fails) == 1
    assert capsys.readouterr().err == "svc: error: /state was trained with --interval-s 10\n"
    assert run_service("svc", lambda stop: None) == 0
    with pytest.raises(RuntimeError):
        run_service("svc", lambda stop: (_ for _ in ()).throw(RuntimeError("a bug")))
    assert signal.getsignal(signal.SIGTERM) is before


@dataclass(frozen=True)
class Settings:
    state_dir: Path
    interval_s: float
    min_rows: int = 500
    train_args: tuple[str, ...] = ()


def test_settings_take_each_field_from_its_flag_or_from_what_is_given():
    p = _parser(intervals=False)
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--train-args", default="")
    args = p.parse_args(["--state-dir", "/s", "--interval-s", "5", "--train-args", "--epochs 2"])
    assert settings(Settings, args, train_args=tuple(args.train_args.split())) == Settings(
        Path("/s"), 5.0, 500, ("--epochs", "2")
    )
