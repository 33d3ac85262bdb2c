"""`--num_workers N` (N > 1): a parent process supervises N forked server processes behind the same ports.

Each worker is a whole server (serving/app/server.py): it loads and polls the model repository itself, warms
up, runs ONNX Runtime with `--intra_op_threads` and serves REST and gRPC on its own event loop. The parent
forks them before it has created any thread, event loop, gRPC object or ONNX Runtime session, and never
creates any afterwards, so restarting a worker later is the same clean fork.

Ports. The parent binds each port once without SO_REUSEPORT, which fails at once (exit 1) when the port is
in use, as with one worker, and turns port 0 into a real port. It then holds a bound, non-listening
SO_REUSEPORT socket on it for its whole life, so no other program can take the port while workers restart.
Each worker listens with SO_REUSEPORT (REST, and gRPC through `grpc.so_reuseport`) once its first model
scan is done. The kernel spreads new connections over the listening workers by a hash of the client
address, so a worker that is starting or restarting gets none. Both protocols scale this way. Serving
gRPC in one worker only would make it a single point of failure.

Metrics. The parent creates a per-run directory for serving/observability/metrics_shared.py, deletes a worker's gauges
and drift windows when it exits, folds its counters into the exited workers' totals (one file however many
restarts), and removes the directory at exit.

Failures. A worker that dies is logged at ERROR and restarted. If a worker dies within CRASH_WINDOW_S of its
start CRASH_LOOP_LIMIT times in a row, that is a crash loop, which no restart will fix: the parent then
stops every worker and exits 1. SIGTERM and SIGINT (Ctrl-C) are forwarded to every worker as SIGTERM.
Each worker drains as a single server does. The parent waits up to the grace period plus
STOP_MARGIN_S, SIGKILLs any worker still running, and exits 0 only when every worker stopped cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.util
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from serving.app.config import ServerConfig
from serving.app.server import WorkerRole, run_server
from serving.observability.metrics_shared import retire_worker

log = logging.getLogger(__name__)

CRASH_WINDOW_S = 10.0  # a worker that dies sooner than this after its start counts towards a crash loop
CRASH_LOOP_LIMIT = 5
RESTART_DELAY_S = 1.0  # pause before restarting a worker that died young, so a crash loop does not spin
STOP_MARGIN_S = 5.0  # on top of the grace period: closing both servers takes up to 2 s after the drain
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
TICK_S = 0.25  # the parent's loop wakes at least this often (restarts are due), and at once on a signal


def reserve_port(host: str, port: int, what: str) -> socket.socket:
    """Check that host:port is free and hold it, bound but not listening, for SO_REUSEPORT workers.

    Returns the reserving socket; its `getsockname()[1]` is the port (port 0 picks a free one).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot bind {what} to {host}:{port}: {exc.strerror}") from exc
        port = probe.getsockname()[1]
    reservation = socket.socket(family, socket.SOCK_STREAM)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reservation.bind((host, port))
    except OSError as exc:  # taken in the instant between the probe and now
        reservation.close()
        raise OSError(f"cannot bind {what} to {host}:{port}: {exc.strerror}") from exc
    return reservation


@dataclass
class _Slot:
    """Worker number `index`: its current process and restart history."""

    index: int
    pid: int = 0
    started: float = 0.0
    quick_deaths: int = 0
    restart_at: float | None = None


class Supervisor:
    """Forks, watches, restarts and stops the workers; `run()` returns the parent's exit code."""

    def __init__(self, cfg: ServerConfig, metrics_dir: Path, reservations: list[socket.socket]) -> None:
        self.cfg, self.metrics_dir, self.reservations = cfg, metrics_dir, reservations
        self.slots = [_Slot(i) for i in range(cfg.num_workers)]
        self.running: dict[int, _Slot] = {}  # pid -> slot
        self.stop_requested = False
        self.kill_at: float | None = None  # set when stopping: the deadline of the workers' drain
        self.exit_code = 0
        self._wake_r, self._wake_w = os.pipe()

    def run(self) -> int:
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Signals only set a flag; the wakeup fd makes the select() below return at once.
        signal.set_wakeup_fd(self._wake_w)
        for sig in (*STOP_SIGNALS, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        for slot in self.slots:
            self._start(slot)
        while self.running or (self.kill_at is None and not self.stop_requested):
            select.select([self._wake_r], [], [], TICK_S)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 512)
            self._reap()
            now = time.monotonic()
            if self.stop_requested and self.kill_at is None:
                self._stop_all(now)
            elif self.kill_at is None:
                for slot in self.slots:
                    if slot.restart_at is not None and slot.restart_at <= now:
                        self._start(slot)
            elif now > self.kill_at:
                for pid, slot in self.running.items():
                    log.error(
                        "worker %d (pid %d) is still running after the drain; killing it", slot.index, pid
                    )
                    os.kill(pid, signal.SIGKILL)
                    self.exit_code = 1
                self.kill_at = float("inf")
        log.info("all workers stopped; exit code %d", self.exit_code)
        return self.exit_code

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum in STOP_SIGNALS:
            self.stop_requested = True

    def _start(self, slot: _Slot) -> None:
        slot.restart_at = None
        pid = os.fork()
        if pid == 0:
            self._become_worker(slot.index)  # never returns
        slot.pid, slot.started = pid, time.monotonic()
        self.running[pid] = slot
        log.info("worker %d started (pid %d)", slot.index, pid)

    def _become_worker(self, index: int) -> None:
        """In the child: drop the parent's signal plumbing and reservations, serve, exit without unwinding."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (*STOP_SIGNALS, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)  # the worker's event loop installs its own handlers
            os.close(self._wake_r)
            os.close(self._wake_w)
            for reservation in self.reservations:
                reservation.close()
            role = WorkerRole(index=index, parent_pid=os.getppid(), metrics_dir=self.metrics_dir)
            code = run_server(self.cfg, role)
        except BaseException:
            log.exception("worker %d failed", index)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # os._exit skips atexit, where multiprocessing unlinks the semaphores of the body decoder's process
            # pool; without this the resource tracker reports them as leaked when the server stops.
            multiprocessing.util._run_finalizers(0)  # type: ignore[attr-defined]  # private, stable since 3.x
            os._exit(code)  # the parent's cleanup (its finally blocks, atexit) is not the worker's to run

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self.running.pop(pid, None)
            if slot is not None:
                self._on_exit(slot, pid, os.waitstatus_to_exitcode(status))

    def _on_exit(self, slot: _Slot, pid: int, code: int) -> None:
        """A worker exited with `code` (negative: killed by that signal)."""
        try:  # its gauges and drift windows go; its counters are folded into the exited workers' totals
            retire_worker(self.metrics_dir, pid)
        except (OSError, ValueError) as exc:  # its totals file is kept, and still counted by every scrape
            log.error("could not clear up the metrics files of worker %d (pid %d): %s", slot.index, pid, exc)
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        # Stopping (Ctrl-C reaches the workers too, so one may exit before the parent forwards SIGTERM):
        # exit 0 is clean, and so is a stop signal that arrived before the worker installed its handlers.
        if self.stop_requested or self.kill_at is not None:
            if code == 0 or -code in STOP_SIGNALS:
                log.info("worker %d (pid %d) stopped", slot.index, pid)
            else:
                log.error("worker %d (pid %d) %s while stopping", slot.index, pid, how)
                self.exit_code = 1
            return
        now = time.monotonic()
        slot.quick_deaths = slot.quick_deaths + 1 if now - slot.started < CRASH_WINDOW_S else 0
        if slot.quick_deaths >= CRASH_LOOP_LIMIT:
            log.critical(
                "WORKER %d (pid %d) %s: %d deaths in a row, each within %.0f s of its start, are a crash loop; "
                "stopping the server",
                slot.index,
                pid,
                how,
                slot.quick_deaths,
                CRASH_WINDOW_S,
            )
            self.exit_code = 1
            self.stop_requested = True
            return
        delay = RESTART_DELAY_S if slot.quick_deaths else 0.0
        log.error("WORKER %d (pid %d) %s; restarting it in %.0f s", slot.index, pid, how, delay)
        slot.restart_at = now + delay

    def _stop_all(self, now: float) -> None:
        self.kill_at = now + self.cfg.grace_period_seconds + STOP_MARGIN_S
        log.info("stopping %d workers (drain up to %.1fs)", len(self.running), self.cfg.grace_period_seconds)
        for pid in self.running:
            with contextlib.suppress(ProcessLookupError):  # it exited; _reap will collect it
                os.kill(pid, signal.SIGTERM)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # e.g. a real-time signal
        return f"signal {number}"


def run_workers(cfg: ServerConfig) -> int:
    """Serve with `cfg.num_workers` processes until SIGTERM/SIGINT; returns the exit code."""
    reservations: list[socket.socket] = []
    try:
        reservations.append(reserve_port(cfg.host, cfg.port, "gRPC"))
        if cfg.rest_api_port:
            reservations.append(reserve_port(cfg.host, cfg.rest_api_port, "REST"))
    except OSError as exc:
        log.error("%s", exc)
        for reservation in reservations:
            reservation.close()
        return 1
    ports = [r.getsockname()[1] for r in reservations]
    cfg = replace(cfg, port=ports[0], rest_api_port=ports[1] if cfg.rest_api_port else 0)
    metrics_dir = Path(tempfile.mkdtemp(prefix="ctr-serving-metrics-"))
    log.info(
        "%d workers on gRPC %s:%d and REST %s:%d; metrics aggregated in %s",
        cfg.num_workers,
        cfg.host,
        cfg.port,
        cfg.host,
        cfg.rest_api_port,
        metrics_dir,
    )
    try:
        return Supervisor(cfg, metrics_dir, reservations).run()
    finally:
        for reservation in reservations:
            reservation.close()
        try:
            shutil.rmtree(metrics_dir)
        except OSError as exc:
            log.warning("could not remove the metrics directory %s: %s", metrics_dir, exc)
