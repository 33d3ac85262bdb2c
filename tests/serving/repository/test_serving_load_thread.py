"""The load thread keeps nothing of a finished load: the version it loaded last can be unloaded and freed while
the thread waits for the next load (a rolled-back newest version once stayed referenced from its frame)."""

from __future__ import annotations

import gc
import threading
import time
import weakref

from serving.repository.loading import _LoadThread


class _Version:
    """Stands for what a load produces (the backend, its sessions)."""


def test_a_finished_load_is_not_referenced_by_the_waiting_thread() -> None:
    version, ran = _Version(), threading.Event()
    ref = weakref.ref(version)

    def job(held: _Version = version) -> None:
        ran.set()

    worker = _LoadThread("load-test")
    worker.jobs.put(job)
    del job, version
    assert ran.wait(10)
    deadline = time.monotonic() + 5
    while ref() is not None:  # the thread goes back to its queue right after the job
        gc.collect()
        assert time.monotonic() < deadline, f"still referenced by {gc.get_referrers(ref())}"
        time.sleep(0.01)
    worker.abandon()
    worker.thread.join(5)
    assert not worker.thread.is_alive()
