"""The run loop of a service: run each step when it is due, until there is none left or a stop is asked for.

A stop (SIGTERM from `docker stop` or the kubelet, or SIGINT) is noticed between steps and while waiting: the step
under way finishes and is recorded, then the loop returns and the process exits 0. A second signal exits 0 at
once, as does a step whose own code exits on SIGTERM (Lightning ends a fit at the next batch): that step is not
recorded, and since every write is durable the restart resumes where the state says. Two schedules drive the loop:
`Intervals` (each interval of request time once it closes: the online trainer, live evaluation) and `Ticks`
(a step every few seconds: the rollout controller).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipelines.service.clock import IntervalClock

POLL_S = 0.5  # the longest sleep: how soon a stop or a newly closed interval is noticed
log = logging.getLogger("pipelines.service")
Sleep = Callable[[float], None]


class Stop:
    """Whether a stop was asked for; `signals()` turns SIGTERM and SIGINT into one."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the signal that asked, or 0 when asked by code

    @property
    def asked(self) -> bool:
        return self.signum is not None

    def ask(self, signum: int = 0) -> None:
        if self.asked and signum:
            sys.exit(0)  # a second signal: do not wait for the step under way
        self.signum = signum

    @contextmanager
    def signals(self, *signums: int) -> Iterator[Stop]:
        """SIGTERM and SIGINT (or `signums`) ask for a stop while inside; the previous handlers come back after."""
        signums = signums or (signal.SIGTERM, signal.SIGINT)
        previous = {s: signal.signal(s, lambda n, _f: self.ask(n)) for s in signums}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


class Schedule(Protocol):
    def due_in(self) -> float | None:
        """Seconds until the next step is due (<= 0: now); None when no step is left."""

    def step(self) -> None:
        """Run the step that is due."""

    def idle(self) -> None:
        """Called before each sleep while no step is due."""


def run(schedule: Schedule, stop: Stop | None = None, sleep: Sleep = time.sleep) -> int:
    """Run `schedule`'s steps as they fall due until none is left or `stop` is asked; returns the steps run."""
    stop = stop or Stop()
    steps = 0
    while not stop.asked:
        wait = schedule.due_in()
        if wait is None:
            break
        if wait > 0:
            schedule.idle()
            sleep(min(wait, POLL_S))
            continue
        try:
            schedule.step()
        except SystemExit:  # a second signal, or a library's own SIGTERM exit (Lightning's, mid-training)
            log.warning("stopped during a step: it is not recorded, and the restart runs it again")
            raise
        steps += 1
    return steps


class IntervalService(Protocol):
    """What `Intervals` drives: a service that runs interval `next` and records it, which moves `next` on."""

    clock: IntervalClock

    @property
    def next(self) -> int: ...

    def run_interval(self, j: int) -> Any: ...

    def idle(self) -> None: ...


@dataclass
class Intervals:
    """Each interval of `service` once it closes, until every interval starting before `until` is done, or
    `count` intervals are (None: no such end)."""

    service: IntervalService
    until: float | None = None
    count: int | None = None
    done: int = 0

    def due_in(self) -> float | None:
        j, clock = self.service.next, self.service.clock
        if self.until is not None and clock.start(j) >= self.until:
            return None
        if self.count is not None and self.done >= self.count:
            return None
        return clock.closes_at(j) - time.time()

    def step(self) -> None:
        self.service.run_interval(self.service.next)
        self.done += 1

    def idle(self) -> None:
        self.service.idle()


@dataclass
class Ticks:
    """`tick` every `every_s` seconds (from the end of one to the start of the next), the first at once. A tick
    that raises is logged to `log` as `what` failing, and tried again on the next."""

    tick: Callable[[], object]
    every_s: float
    log: logging.Logger
    what: str = "a tick"
    next_at: float = field(default=-float("inf"))  # time.monotonic() of the next tick

    def due_in(self) -> float:
        return self.next_at - time.monotonic()

    def step(self) -> None:
        try:
            self.tick()
        except Exception:
            self.log.exception("%s failed; trying again in %g s", self.what, self.every_s)
        self.next_at = time.monotonic() + self.every_s

    def idle(self) -> None:
        pass
