"""Say where the memory is: the report of a live server (handing freed memory back, `malloc_trim`, is
serving/observability/process.py's, which the REST layer's sweep calls).

`CTR_SERVING_MEMORY_REPORT=FILE` (a debugging aid, off by default): on SIGUSR2 the REST server appends one JSON
line to FILE: VmRSS, glibc's `mallinfo2` totals and, with Python's own `PYTHONTRACEMALLOC=1`, the traced bytes
and their top sites. Python-level bytes far below RSS mean freed-but-kept heap (fragmentation), not live objects.
"""

from __future__ import annotations

import ctypes
import json
import os
import tracemalloc
from collections.abc import Callable
from typing import Any

from serving.observability.process import libc_function, rss_bytes

REPORT_ENV = "CTR_SERVING_MEMORY_REPORT"


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


_mallinfo2 = libc_function("mallinfo2", [], _MallInfo2)


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
