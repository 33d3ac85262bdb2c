"""Hand memory that Python has freed back to the operating system.

glibc's malloc keeps freed heap pages for reuse, so after a burst of large request bodies the resident size
stays at its peak even though every object is gone. `malloc_trim(0)` returns the free pages of the heap
(measured against a fixed mmap threshold in docs/serving-http.md). Elsewhere (musl, macOS) it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _libc_function(name: str, argtypes: list[type]) -> Callable[..., int] | None:
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)  # ctypes releases the GIL
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function  # type: ignore[no-any-return]


_malloc_trim = _libc_function("malloc_trim", [ctypes.c_size_t])


def release_freed_memory() -> None:
    """Give free heap pages back to the OS (glibc `malloc_trim`); it walks the whole heap, so it runs after
    large bodies are dropped, never once per request."""
    if _malloc_trim is not None:
        _malloc_trim(0)
