"""This process's memory as the system sees it, and glibc's hand-back of heap pages Python has freed.

glibc's malloc keeps freed heap pages for reuse, so after a burst of large request bodies, or a version
unloaded, the resident size stays at its peak even though every object is gone. `malloc_trim(0)` returns the
free pages of every arena (measured against a fixed mmap threshold in docs/serving-http.md). Elsewhere (musl,
macOS) it is a no-op. Used by the REST layer's sweep (serving/http/memory.py), the reclaim after an unload
(serving/repository/reclaim.py) and the `process_resident_memory_bytes` gauge (serving/observability/metrics.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path
from typing import Any


def libc_function(name: str, argtypes: list[type], restype: Any = ctypes.c_int) -> Callable[..., Any] | None:
    """glibc's function `name` through ctypes (which releases the GIL while it runs); None where there is none."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes, function.restype = argtypes, restype
    return function  # type: ignore[no-any-return]


_malloc_trim = libc_function("malloc_trim", [ctypes.c_size_t])


def release_freed_memory() -> None:
    """Give free heap pages back to the OS (glibc `malloc_trim`); it walks the whole heap, so it runs after
    large bodies are dropped or a version is unloaded, never once per request."""
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
