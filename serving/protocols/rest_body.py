"""REST predict bodies -> float32 features: cheap bounds first, and large bodies decoded in a child process.

Parsing JSON and building the numpy array are single C calls that hold the GIL for a time that grows with the
body, so a thread would stall the event loop, which serves REST and gRPC, just as much. Bodies up to
INLINE_MAX_BYTES hold the loop briefly and are decoded inline; larger ones go to a one-process pool, and the
loop only pays for copying the bytes to it.
Before any parse, byte counts bound how many arrays, objects and values the body can hold, so a body of
`[[],[],...]` or of 4M zeros is refused without being parsed.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import numpy as np

from serving.codecs.rest_codec import decode_predict
from serving.errors import InvalidArgument, Unavailable
from serving.observability.process import release_freed_memory
from serving.requests import DecodedRequest
from serving.signatures import Signature

T = TypeVar("T")

INLINE_MAX_BYTES = 256 << 10
BOUNDS_MIN_BYTES = 64 << 10  # a smaller body holds too few values to be costly to parse: no bounds needed
_OPEN_ARRAY, _OPEN_OBJECT, _COMMA = ord("["), ord("{"), ord(",")


class BodyOverLimits(InvalidArgument):
    """The body holds more arrays, objects or values than `--max_instances` full instances could (400)."""


def check_body_bounds(body: bytes | bytearray, width: int, max_instances: int) -> None:
    """Refuse, from byte counts alone, a body that cannot be a batch within `max_instances`.

    Any valid body has at most N+1 '[' (the list of rows, one per row), N+2 '{' (envelope, `inputs`, one per
    named instance) and N*F+1 ',' (values, rows, `signature_name`); strings in it are keys and names only.
    The bounds allow twice that, so a batch a little over the limit still gets validation's exact message.
    """
    data = np.frombuffer(body, np.uint8)  # numpy's vectorised compare counts faster than bytes.count
    arrays, objects = int(np.count_nonzero(data == _OPEN_ARRAY)), int(np.count_nonzero(data == _OPEN_OBJECT))
    if arrays > 2 * max_instances + 8 or objects > 2 * max_instances + 8:
        raise BodyOverLimits(
            f"the body holds {arrays} JSON arrays and {objects} objects, more than a batch of "
            f"{max_instances} instances can (--max_instances); split the request"
        )
    commas = int(np.count_nonzero(data == _COMMA))
    if commas > 2 * max_instances * width + 8:
        raise BodyOverLimits(
            f"the body holds over {commas} values, more than {max_instances} instances of {width} "
            "features (--max_instances); split the request"
        )


def decode_body(body: bytes | bytearray, sig: Signature, max_instances: int) -> tuple[bool, DecodedRequest]:
    """Bounds, parse and convert one predict body. Returns (columnar format?, the decoded request)."""
    try:
        return _decode(body, sig, max_instances)
    finally:
        if len(body) > INLINE_MAX_BYTES:  # in the child: hand its parse garbage back to the OS too
            release_freed_memory()


def _decode(body: bytes | bytearray, sig: Signature, max_instances: int) -> tuple[bool, DecodedRequest]:
    if len(body) > BOUNDS_MIN_BYTES:
        check_body_bounds(body, sig.width, max_instances)
    return decode_predict(body, sig)


PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


def _die_with_parent(parent_pid: int) -> None:
    """In the child: get SIGKILL when the server exits, however it exits (a worker ends with os._exit)."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the child still exits when its pipe closes
        return
    if os.getppid() != parent_pid:  # the server died before the line above
        os._exit(0)


class BodyDecoder:
    """Decodes predict bodies: small ones on the calling thread, large ones in a child process."""

    def __init__(self, max_instances: int) -> None:
        self.max_instances = max_instances
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the child now (spawned: the parent has gRPC and ORT threads, which must not be forked)."""
        self._pool = ProcessPoolExecutor(
            1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        )
        self._pool.submit(int)  # imports numpy and orjson there before the first large body arrives

    async def decode(self, body: bytes | bytearray, sig: Signature) -> tuple[bool, DecodedRequest]:
        """One predict body for `sig`: (columnar format?, the decoded request); large bodies in the child."""
        return await self.run(decode_body, body, sig, self.max_instances)

    async def run(self, parse: Callable[..., T], body: bytes | bytearray, *args: Any) -> T:
        """`parse(body, *args)` (a module-level function, e.g. the v2 infer parser): inline for a small body,
        in the child for a large one."""
        if len(body) <= INLINE_MAX_BYTES or self._pool is None:
            return parse(body, *args)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, parse, body, *args)
        except BrokenProcessPool as exc:  # the child died (e.g. killed): start a new one for the next body
            self.close()
            self.start()
            raise Unavailable("the body decoder restarted; retry the request") from exc

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
