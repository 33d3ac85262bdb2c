"""Hand memory that Python has freed back to the operating system, and say where it is.

glibc's malloc keeps freed heap pages for reuse, so after a burst of large request bodies the resident size
stays at its peak even though every object is gone. `malloc_trim(0)` returns the free pages of the heap
(measured against a fixed mmap threshold in docs/serving-http.md). Elsewhere (musl, macOS) it is a no-op.

`CTR_SERVING_MEMORY_REPORT=FILE` (a debugging aid, off by default): on SIGUSR2 the REST server appends one JSON
line to FILE: VmRSS, glibc's `mallinfo2` totals and, with Python's own `PYTHONTRACEMALLOC=1`, the traced bytes
and their top sites. Python-level bytes far below RSS mean freed-but-kept heap (fragmentation), not live objects.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPORT_ENV = "CTR_SERVING_MEMORY_REPORT"


def _libc_function(name: str, argtypes: list[type], restype: Any = ctypes.c_int) -> Callable[..., Any] | None:
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)  # ctypes releases the GIL
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes, function.restype = argtypes, restype
    return function  # type: ignore[no-any-return]


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes of the brk heap and the other arenas' heaps
            "ordblks",
            "smblks",
            "hblks",  # chunks in their own mmap
            "hblkhd",  # bytes in their own mmap
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use
            "fordblks",  # bytes free, kept by malloc
            "keepcost",
        )
    ]


_malloc_trim = _libc_function("malloc_trim", [ctypes.c_size_t])
_mallinfo2 = _libc_function("mallinfo2", [], _MallInfo2)


def release_freed_memory() -> None:
    """Give free heap pages back to the OS (glibc `malloc_trim`); it walks the whole heap, so it runs after
    large bodies are dropped, never once per request."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def rss_bytes() -> int:
    """This process's resident size (VmRSS), 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_report(top: int = 12) -> dict[str, Any]:
    """RSS, malloc's view (in use, free but kept, mmapped) and Python's traced allocations, in bytes."""
    report: dict[str, Any] = {"rss": rss_bytes()}
    if _mallinfo2 is not None:
        info = _mallinfo2()
        report["malloc"] = {field[0]: getattr(info, field[0]) for field in _MallInfo2._fields_}
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        stats = tracemalloc.take_snapshot().statistics("lineno")[:top]
        report["traced"] = {"current": current, "peak": peak}
        report["top"] = [f"{s.size >> 10} KiB x{s.count} {s.traceback[0]}" for s in stats]
    return report


def install_report_signal(add_signal_handler: Callable[..., None]) -> None:
    """With CTR_SERVING_MEMORY_REPORT set: append a report to that file on each SIGUSR2."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    import signal

    def write() -> None:
        with open(path, "a") as out:
            out.write(json.dumps(memory_report()) + "\n")

    add_signal_handler(signal.SIGUSR2, write)
