"""Model versions: poll `--model_base_path`, load + warm new versions, swap atomically, unload when idle.

TF Serving's availability-preserving policy: a version leaves service only once the versions the policy
wants are loaded, and its memory is released only after its last in-flight request has finished.
Everything here runs on the event-loop thread, except backend loading, which runs in an executor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from serving.backends import Backend, load_backend
from serving.batching import DynamicBatcher
from serving.errors import InvalidArgument, NotFound, Unavailable
from serving.metrics import ServingMetrics
from serving.version_policy import VersionPolicy
from serving.warmup import warm_up

log = logging.getLogger(__name__)


@dataclass
class LoadedVersion:
    """One servable: a loaded backend plus its in-flight request count."""

    version: int
    backend: Backend
    batcher: DynamicBatcher | None = None
    inflight: int = 0
    retired: bool = False


@dataclass
class VersionState:
    """What the status endpoint reports for one version (TF Serving's ModelVersionStatus)."""

    version: int
    state: str = "START"  # START, LOADING, AVAILABLE, UNLOADING, END
    error_code: str = "OK"
    error_message: str = ""
    failed_stamp: int | None = field(default=None, repr=False)  # mtime_ns of the folder that failed


def _stamp(path: Path) -> int:
    """Folder change stamp: a failed version is retried only when its files change."""
    return max((e.stat().st_mtime_ns for e in os.scandir(path)), default=path.stat().st_mtime_ns)


def versions_on_disk(base_path: Path) -> dict[int, Path]:
    """Numeric subfolders of the model base path (temporary folders such as `.tmp-3` are ignored)."""
    try:
        entries = list(os.scandir(base_path))
    except FileNotFoundError:
        return {}
    return {int(e.name): Path(e.path) for e in entries if _is_version(e.name) and e.is_dir()}


def _is_version(name: str) -> bool:
    # isdigit() alone accepts names such as '²' that int() rejects.
    return name.isascii() and name.isdigit() and int(name) > 0


class ModelManager:
    """Keeps the set of loaded versions equal to what the version policy asks for."""

    def __init__(
        self,
        name: str,
        base_path: Path,
        backend_kind: str,
        intra_op_threads: int,
        policy: VersionPolicy,
        labels: dict[str, int],
        metrics: ServingMetrics,
        load_executor: Executor,
        make_batcher: Callable[[LoadedVersion], DynamicBatcher] | None = None,
    ) -> None:
        self.name, self.base_path, self.backend_kind = name, base_path, backend_kind
        self.intra_op_threads, self.policy, self.labels = intra_op_threads, policy, labels
        self.metrics, self._load_executor = metrics, load_executor
        self._make_batcher = make_batcher  # None: batching off
        self.loaded: dict[int, LoadedVersion] = {}
        self.states: dict[int, VersionState] = {}
        self.latest: LoadedVersion | None = None

    # --- request path -------------------------------------------------------------------------
    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> LoadedVersion:
        """Find the servable for a request; raise NotFound / InvalidArgument / Unavailable."""
        if name != self.name:
            kind = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
            raise NotFound(f"Servable not found for request: {kind}")
        if label is not None:
            if label not in self.labels:
                raise InvalidArgument(f"Unrecognized servable version label: {label}")
            version = self.labels[label]
        if version is None:
            if self.latest is None:
                raise Unavailable(f"Servable not found for request: Latest({name}); no version is loaded yet")
            return self.latest
        lv = self.loaded.get(version)
        if lv is None:
            raise NotFound(f"Servable not found for request: Specific({name}, {version})")
        return lv

    def acquire(self, lv: LoadedVersion) -> None:
        lv.inflight += 1

    def release(self, lv: LoadedVersion) -> None:
        """End one request on `lv`; the last request on a retired version unloads it."""
        lv.inflight -= 1
        if lv.retired and lv.inflight == 0:
            self._unload(lv)

    def status(self, name: str, version: int | None = None) -> list[VersionState]:
        """Version states, newest first; raise NotFound for an unknown model or version."""
        if name != self.name:
            raise NotFound(f"Could not find any versions of model {name}")
        if version is None:
            return sorted(self.states.values(), key=lambda s: -s.version)
        if version not in self.states:
            raise NotFound(f"Could not find version {version} of model {name}")
        return [self.states[version]]

    # --- polling ------------------------------------------------------------------------------
    async def poll_forever(self, interval_s: float) -> None:
        """Re-scan every `interval_s`; one failed scan is logged and never stops the loop."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.poll_once()
            except Exception:
                log.exception("polling %s failed; will retry in %.1fs", self.base_path, interval_s)

    async def poll_once(self) -> None:
        """Load what the policy wants (newest first), then retire what it no longer wants."""
        on_disk = versions_on_disk(self.base_path)
        if not on_disk:
            # An empty or missing base path is more often a transient mount problem than an intent to
            # stop serving: keep what is loaded (TF Serving would unload it) and say so.
            log.warning(
                "no version folders under %s; keeping loaded versions %s", self.base_path, sorted(self.loaded)
            )
            return
        while True:
            candidates = [v for v, p in on_disk.items() if not self._failed(v, p)]
            aspired = self.policy.select(candidates)
            to_load = sorted(set(aspired) - set(self.loaded), reverse=True)
            if not to_load:
                break
            await self._load(to_load[0], on_disk[to_load[0]])
        for v in sorted(set(self.loaded) - set(aspired)):
            self._retire(self.loaded[v], reason="deleted" if v not in on_disk else "superseded")
        for v, state in self.states.items():
            if v not in on_disk and state.state == "END" and state.failed_stamp is not None:
                state.failed_stamp = None  # the failed folder is gone; a new one with this number is retried

    def _failed(self, version: int, path: Path) -> bool:
        state = self.states.get(version)
        if state is None or state.failed_stamp is None:
            return False
        try:
            return state.failed_stamp == _stamp(path)
        except FileNotFoundError:  # removed since the scan: not a candidate
            return True

    async def _load(self, version: int, path: Path) -> None:
        state = self.states[version] = VersionState(version, state="LOADING")
        log.info("loading %s version %d from %s (%s backend)", self.name, version, path, self.backend_kind)
        started = time.perf_counter()
        stamp = -1  # a folder that vanished before its stamp was read stays failed until it is back
        loop = asyncio.get_running_loop()
        try:
            stamp = _stamp(path)  # inside the try: the folder may vanish between the scan and now
            backend, n_warmup = await loop.run_in_executor(self._load_executor, self._load_and_warm, path)
        except Exception as exc:  # any load/warm-up failure: the old versions keep serving
            state.state, state.error_code, state.failed_stamp = "END", "UNKNOWN", stamp
            state.error_message = f"failed to load version {version}: {exc}"
            self.metrics.load_failures.inc(self.name)
            log.error("%s; previously loaded versions keep serving", state.error_message)
            return
        lv = LoadedVersion(version, backend)
        if self._make_batcher is not None:
            lv.batcher = self._make_batcher(lv)
        self.loaded[version] = lv
        state.state = "AVAILABLE"
        self._refresh_latest()
        log.info(
            "%s version %d available (%d warm-up requests, %.2fs)",
            self.name,
            version,
            n_warmup,
            time.perf_counter() - started,
        )

    def _load_and_warm(self, path: Path) -> tuple[Backend, int]:
        backend = load_backend(self.backend_kind, path, self.intra_op_threads)
        return backend, warm_up(backend, path)

    def _retire(self, lv: LoadedVersion, reason: str) -> None:
        log.info(
            "retiring %s version %d (%s); %d requests in flight", self.name, lv.version, reason, lv.inflight
        )
        del self.loaded[lv.version]
        lv.retired = True
        self.states[lv.version].state = "UNLOADING"
        self._refresh_latest()
        if lv.inflight == 0:
            self._unload(lv)

    def _unload(self, lv: LoadedVersion) -> None:
        if lv.batcher is not None:
            lv.batcher.close()
        state = self.states.get(lv.version)
        if state is not None and state.state == "UNLOADING":
            state.state = "END"
        log.info("unloaded %s version %d", self.name, lv.version)

    def _refresh_latest(self) -> None:
        self.latest = self.loaded[max(self.loaded)] if self.loaded else None
        self.metrics.model_version.set(float(max(self.loaded, default=0)), self.name)
