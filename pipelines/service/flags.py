"""The flags, logging and metrics port every service shares, and its `main()` around the run.

The flag names and defaults stay each service's own (compose.yaml and k8s/ pass them): `add_clock_flags` takes
the attribution window's flag name (the trainer's `--window-s`, live evaluation's `--attribution-window-s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, start_http_server

from pipelines.service.clock import IntervalClock
from pipelines.service.loop import Stop

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def add_clock_flags(
    p: argparse.ArgumentParser, interval_s: float, window_flag: str, window_s: float, window_help: str
) -> None:
    """--interval-s and the attribution window's flag, with the service's defaults."""
    p.add_argument(
        "--interval-s",
        type=float,
        default=interval_s,
        help=f"seconds of request time per interval (default {interval_s:g})",
    )
    p.add_argument(window_flag, type=float, default=window_s, help=f"{window_help} (default {window_s:g})")


def clock_problems(clock: IntervalClock, window_flag: str) -> list[str]:
    """What is wrong with the clock's flags (none: an empty list)."""
    if clock.interval_s <= 0 or clock.window_s < 0:
        return [f"need --interval-s > 0 and {window_flag} >= 0, got {clock.interval_s:g}, {clock.window_s:g}"]
    return []


def add_run_flags(
    p: argparse.ArgumentParser, what: str, parse_time: Callable[[str], float], intervals: bool = False
) -> None:
    """--start and --until (times as `parse_time` reads them), and --intervals: where a fresh state starts and
    when the run ends; `what` is what the service does to an interval ("trained", "evaluated")."""
    p.add_argument(
        "--start",
        type=parse_time,
        help="first interval of a fresh state: the first starting at or after this (default: the current one)",
    )
    p.add_argument(
        "--until",
        type=parse_time,
        help=f"stop once every interval starting before this is {what} (default: run on)",
    )
    if intervals:
        p.add_argument(
            "--intervals", type=int, help=f"stop after this many intervals {what} (default: run on)"
        )


def add_metrics_flags(p: argparse.ArgumentParser, port: int) -> None:
    """--metrics-port (0: none) and --metrics-host."""
    p.add_argument(
        "--metrics-port",
        type=int,
        default=port,
        help=f"serve Prometheus /metrics here (0: off; default {port})",
    )
    p.add_argument(
        "--metrics-host", default="0.0.0.0", help="address the metrics port binds (default 0.0.0.0)"
    )


def add_engine_flag(p: argparse.ArgumentParser) -> None:
    """--engine: the click join the service runs (the online trainer's and live evaluation's)."""
    p.add_argument(
        "--engine",
        choices=("embedded", "flink"),
        default="embedded",
        help="the click join: embedded (pipelines/clicks/join.py, the default) or the same join as a Flink job "
        "(pipelines/clicks/flink/; needs make flink-venv)",
    )


def settings(kind: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A service's settings dataclass: each field from the flag of its name, `given` for the others (a field with
    neither keeps its default)."""
    names = {f.name for f in dataclasses.fields(kind)}
    flagged = {n: getattr(args, n) for n in names - set(given) if hasattr(args, n)}
    return kind(**flagged, **given)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> None:
    """Expose `registry` on http://host:port/metrics, from a daemon thread (port 0: no endpoint)."""
    if port:
        start_http_server(port, host, registry=registry)


def setup_logging(logger: str, stream: IO[str] = sys.stdout) -> None:
    """The service's own logger at INFO, the libraries' at WARNING, one timestamped line each."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=stream
    )
    logging.getLogger(logger).setLevel(logging.INFO)


def run_service(
    prog: str, start: Callable[[Stop], object], errors: tuple[type[Exception], ...] = (ValueError, OSError)
) -> int:
    """`start(stop)` with SIGTERM and SIGINT asking `stop` (the step under way finishes); returns 0, or 1 after
    printing `prog: error: ...` for one of `errors` (a bad state folder, an unwritable disk)."""
    with Stop().signals() as stop:
        try:
            start(stop)
        except errors as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 1
    return 0
