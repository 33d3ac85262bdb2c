"""After an unload: the memory of the version goes back, and nothing of ours still holds the version.

An unloaded version is freed by reference counting once its last request has answered: nothing of the server
refers to it by then (docs/perf/serving-memory.md lists what did, and what each held). A moment later
(RECLAIM_DELAY_S, once the last answer is written), `Reclaimer` makes sure of it:

1. one full collection of the cyclic garbage collector frees what only a reference cycle still held
   (TensorFlow's loaded functions are full of cycles; ours have none);
2. weak references to the version's parts (the servable, its backend, the runtime's sessions, its feature
   transform) must all be dead: one still alive is a leak, logged once at WARNING with the types that refer
   to it;
3. glibc's `malloc_trim` hands the freed heap pages back to the system (serving/observability/process.py), on the disk
   thread: it walks the whole heap, with the GIL released.

One INFO line per unloaded version says what it took: `ctr version 3 reclaimed: ... RSS 231 MiB`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
import weakref
from concurrent.futures import Executor
from typing import Any

from serving.observability.process import release_freed_memory, rss_bytes
from serving.runtime.servable import LoadedVersion

log = logging.getLogger("serving.repository.manager")
RECLAIM_DELAY_S = 2.0  # after the unload: the last answer is written, drift's pending rows flushed (1 s)
# Attributes of a backend that hold a runtime's objects: ONNX Runtime's sessions, TensorFlow's loaded model.
RUNTIME_PARTS = ("_session", "_raw_session", "_loaded")


def version_parts(servable: LoadedVersion) -> list[object]:
    """The objects of a version that must not outlive its unload."""
    found: list[object] = [servable, servable.backend]
    runtime = getattr(servable.backend, "backend", servable.backend)  # a SpecBackend wraps the runtime's
    transform = getattr(servable.backend, "transform", None)  # the compiled FeatureSpec (SpecBackend)
    found += [o for o in (runtime, transform) if o is not None and o is not servable.backend]
    found += [getattr(runtime, name) for name in RUNTIME_PARTS if getattr(runtime, name, None) is not None]
    return found


class Reclaimer:
    """Checks and hands back what the unloaded versions of one model held."""

    def __init__(self, name: str, executor: Executor | None) -> None:
        """`executor`: where `malloc_trim` runs (the disk thread); None: inline."""
        self.name, self._executor = name, executor

    def unloaded(self, servable: LoadedVersion) -> None:
        """Watch the parts of `servable`, just unloaded, and reclaim its memory in RECLAIM_DELAY_S."""
        parts = [(type(p).__name__, weakref.ref(p)) for p in version_parts(servable)]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a unit test): nothing runs later
            return
        loop.call_later(RECLAIM_DELAY_S, self.reclaim, servable.version, parts)

    def reclaim(self, version: int, parts: list[tuple[str, weakref.ref[Any]]]) -> list[str]:
        """Collect, check the parts, trim; returns the names of the parts still alive (a leak)."""
        started = time.perf_counter()
        found = gc.collect()
        collected_ms = (time.perf_counter() - started) * 1e3
        leaked = [name for name, ref in parts if ref() is not None]
        for name, ref in parts:
            part = ref()
            if part is None:
                continue
            here = sys._getframe()  # this frame refers to it too
            holders = sorted({type(r).__name__ for r in gc.get_referrers(part) if r is not here})
            del part
            log.warning(
                "%s version %d was unloaded but its %s is still referenced (by %s): a leak, its memory stays",
                self.name,
                version,
                name,
                ", ".join(holders) or "nothing the collector sees",
            )
        what = f"still referenced: {', '.join(leaked)}" if leaked else "nothing of it is referenced"

        def trim() -> None:
            release_freed_memory()
            log.info(
                "%s version %d reclaimed: %d cyclic objects freed in %.1f ms, %s; RSS %d MiB",
                self.name,
                version,
                found,
                collected_ms,
                what,
                rss_bytes() >> 20,
            )

        if self._executor is None:
            trim()
        else:
            with contextlib.suppress(RuntimeError):  # the executor is shut down: the server is stopping
                self._executor.submit(trim)
        return leaked
