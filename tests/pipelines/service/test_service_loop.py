"""The run loop: intervals as they close, until/count, ticks that survive a failure, and a stop (SIGTERM) that
lets the step under way finish and be recorded."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipelines.service.clock import IntervalClock
from pipelines.service.loop import POLL_S, Intervals, Stop, Ticks, run
from tests.helpers import REPO_ROOT


@dataclass
class Recorder:
    """An interval service that records which intervals it ran."""

    next: int
    clock: IntervalClock = field(default_factory=lambda: IntervalClock(10.0, 0.0))
    ran: list[int] = field(default_factory=list)
    idled: int = 0
    stop_after: Stop | None = None  # asked while the first interval runs

    def run_interval(self, j: int) -> None:
        if self.stop_after is not None:
            self.stop_after.ask()
        self.ran.append(j)
        self.next = j + 1

    def idle(self) -> None:
        self.idled += 1


def test_closed_intervals_run_in_turn_until_every_one_starting_before_until_is_done():
    service = Recorder(next=3)
    assert run(Intervals(service, until=60.0)) == 3
    assert service.ran == [3, 4, 5] and service.idled == 0


def test_count_ends_the_run_after_that_many_intervals():
    service = Recorder(next=3)
    assert run(Intervals(service, count=2)) == 2
    assert service.ran == [3, 4]


def test_an_open_interval_is_waited_for_in_sleeps_of_at_most_poll_s():
    service, stop, slept = Recorder(next=IntervalClock(10.0, 0.0).current()), Stop(), []

    def sleep(s: float) -> None:
        slept.append(s)
        stop.ask()

    assert run(Intervals(service), stop, sleep) == 0
    assert (slept, service.idled, service.ran) == ([POLL_S], 1, [])


def test_a_stop_asked_during_a_step_lets_it_finish_then_ends_the_run():
    stop = Stop()
    service = Recorder(next=3, stop_after=stop)
    assert run(Intervals(service), stop) == 1
    assert service.ran == [3]


def test_a_tick_that_fails_is_logged_and_the_next_tick_comes(caplog: pytest.LogCaptureFixture):
    stop, times = Stop(), []

    def tick() -> None:
        times.append(time.monotonic())
        if len(times) == 2:
            raise RuntimeError("the server is gone")
        if len(times) == 3:
            stop.ask()

    with caplog.at_level(logging.ERROR, "test.ticks"):
        assert run(Ticks(tick, 0.05, logging.getLogger("test.ticks"), "ctr: a rollout tick"), stop) == 3
    assert [r.getMessage() for r in caplog.records] == ["ctr: a rollout tick failed; trying again in 0.05 s"]
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.05


def test_sigterm_asks_the_stop_a_second_exits_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with Stop().signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.asked and stop.signum == signal.SIGTERM
        with pytest.raises(SystemExit) as e:
            os.kill(os.getpid(), signal.SIGTERM)
        assert e.value.code == 0
    assert signal.getsignal(signal.SIGTERM) is before


# A service whose interval takes `sys.argv[2]` seconds and is recorded in a state file at its end.
SERVICE = """
import sys, time
from dataclasses import dataclass
from pathlib import Path
from pipelines.service.clock import IntervalClock
from pipelines.service.flags import run_service
from pipelines.service.loop import Intervals, run
from pipelines.service.state_file import StateFile

@dataclass
class State:
    next: int

class Service:
    clock = IntervalClock(1.0, 0.0)
    def __init__(self):
        self.file = StateFile(Path(sys.argv[1]), State, "a state")
        self.state = self.file.open(State(100), {}, "", "")
    @property
    def next(self):
        return self.state.next
    def run_interval(self, j):
        print("interval", j, "started", flush=True)
        time.sleep(float(sys.argv[2]))
        self.state.next = j + 1
        self.file.save(self.state)
    def idle(self):
        pass

sys.exit(run_service("svc", lambda stop: run(Intervals(Service()), stop)))
"""


def _sigterm_mid_interval(tmp_path: Path, step_s: float, signals: int) -> tuple[int, str, str, str]:
    state = tmp_path / "state.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(state), str(step_s)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()  # the first interval is under way
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.05)
        code = proc.wait(timeout=10)
    finally:
        proc.kill()
    assert proc.stderr is not None
    return code, first + proc.stdout.read(), state.read_text(), proc.stderr.read()


def test_sigterm_mid_interval_finishes_and_records_it_then_exits_0(tmp_path: Path):
    code, out, state, err = _sigterm_mid_interval(tmp_path, 0.3, signals=1)
    assert (code, out, err) == (0, "interval 100 started\n", "")
    assert state == '{\n "next": 101\n}\n'


def test_a_second_sigterm_exits_0_at_once_leaving_the_interval_unrecorded(tmp_path: Path):
    code, out, state, err = _sigterm_mid_interval(tmp_path, 30.0, signals=2)
    assert (code, out) == (0, "interval 100 started\n")
    assert state == '{\n "next": 100\n}\n'
    assert err == "stopped during a step: it is not recorded, and the restart runs it again\n"
