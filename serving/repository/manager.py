"""Model versions: poll `--model_base_path`, verify, load + warm new versions, swap atomically, unload when idle.

TF Serving's availability-preserving policy: a version leaves service only once the versions the policy
wants are loaded, and its memory is released only after its last in-flight request has finished.

Nothing in a version folder is trusted before it is checked (serving/repository/manifest_check.py), and every fault
stays with its own version: an incomplete folder waits (up to `--manifest_wait_timeout_seconds`), a corrupt,
unreadable or hung one fails alone and is retried only once one of its files changes. docs/serving-versions.md
has the rules. All state lives on the event-loop thread; folder scans run on `disk_executor`, and the loads on
the model's load thread, a new one after a load hangs (serving/repository/loading.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol

from ctr_contract.ratelog import RateLimitedLog
from ctr_store.versions import BAD_MANIFEST
from serving.errors import NotFound
from serving.observability.metrics import ServingMetrics
from serving.repository.bucket import BasePath, BucketMirror, SyncReport
from serving.repository.loading import Loader
from serving.repository.manifest_check import check_outputs
from serving.repository.policy import VersionPolicy
from serving.repository.reclaim import Reclaimer
from serving.repository.scan import Scan, scan_base
from serving.repository.states import VersionState, VersionStates
from serving.repository.warmup import warm_up
from serving.runtime.backends import Backend, load_backend
from serving.runtime.servable import LoadedVersion, Runner, build_runners
from serving.runtime.spec_backend import with_spec_transform

log = logging.getLogger(__name__)
limited = RateLimitedLog(log)
MAX_HUNG_LOADS = 4  # abandoned load threads still running; no new load starts beyond this
MAX_NAMES_REPORTED = 1000  # odd folder names remembered so that each is logged once


def versions_on_disk(base_path: Path) -> dict[int, Path]:
    """Version folders under the model base path (by `ctr_contract.parse_version_dir`); {} when unreadable."""
    return scan_base(base_path, set()).versions


class VersionWatcher(Protocol):
    """What the versions serve to (serving/routing/router.py): told of every change, on the event loop."""

    def versions_changed(self, loaded: dict[int, LoadedVersion], latest: LoadedVersion | None) -> None:
        """A version became AVAILABLE or was retired; `loaded`: the versions that serve now."""

    def unloaded(self, version: int) -> None:
        """A retired version was unloaded after its last request."""


class ModelManager:
    """Keeps the set of loaded versions equal to what the version policy asks for."""

    def __init__(
        self,
        name: str,
        base_path: BasePath,
        backend_kind: str,
        intra_op_threads: int,
        policy: VersionPolicy,
        metrics: ServingMetrics,
        disk_executor: Executor,
        watcher: VersionWatcher,
        make_runners: Callable[[Backend, int], dict[str, Runner]] | None = None,
        manifest_wait_s: float = 600.0,
        load_timeout_s: float = 600.0,
        cache_root: Path | None = None,
        download_timeout_s: float = 600.0,
    ) -> None:
        """`watcher`: told of each version loaded, retired and unloaded (the model's router). A base path in
        a bucket is mirrored into `cache_root/<name>/` (serving/repository/bucket.py), which is then scanned."""
        self.name, self.source, self.backend_kind = name, base_path, backend_kind
        self.mirror: BucketMirror | None = None
        if isinstance(base_path, Path):
            self.base_path = base_path
        else:
            if cache_root is None:
                raise ValueError(
                    f"model {name}: a base path in a bucket ({base_path}) needs --model_cache_dir"
                )
            folder = name if name.strip(".") else name.replace(".", "%2E")  # never `..`
            self.mirror = BucketMirror(
                name, base_path, cache_root / folder, metrics, download_timeout_s, manifest_wait_s
            )
            self.base_path = self.mirror.cache
        self.intra_op_threads, self.policy = intra_op_threads, policy
        self.metrics, self._disk_executor, self._watcher = metrics, disk_executor, watcher
        # A loaded version's runner per signature (serving/runtime/servable.py); None: each request runs
        # alone, large ones on the event loop's default thread pool.
        self._make_runners = make_runners or (lambda b, v: build_runners(b, None, None, metrics, name, v))
        self.load_timeout_s = load_timeout_s  # 0: no limit
        self.loaded: dict[int, LoadedVersion] = {}
        self.states = VersionStates(name, metrics, manifest_wait_s)
        self.latest: LoadedVersion | None = None
        self._hung: list[threading.Thread] = []
        self._base_condition = ""  # the last reported problem with the base path ("" = none)
        self._names_reported: set[str] = set()
        self._reclaimer = Reclaimer(name, disk_executor)
        self._loader = Loader(name)  # one load thread (serving/repository/loading.py)

    # --- request path -------------------------------------------------------------------------
    def acquire(self, servable: LoadedVersion) -> None:
        servable.inflight += 1

    def release(self, servable: LoadedVersion) -> None:
        """End one request on `servable`; the last request on a retired version unloads it (the predictor
        decrements a serving version's count itself and calls this only for a retired one)."""
        servable.inflight -= 1
        if servable.retired and servable.inflight == 0:
            self._unload(servable)

    def status(self, name: str, version: int | None = None) -> list[VersionState]:
        """Version states, newest first; raise NotFound for an unknown model or version."""
        if name != self.name:
            raise NotFound(f"Could not find any versions of model {name}")
        if version is None:
            return sorted(self.states.values(), key=lambda s: -s.version)
        if version not in self.states:
            raise NotFound(f"Could not find version {version} of model {name}")
        return [self.states[version]]

    def change_policy(self, policy: VersionPolicy) -> bool:
        """Take the model config's new version policy; True when it changed (the next scan applies it)."""
        changed, self.policy = policy != self.policy, policy
        return changed

    # --- polling ------------------------------------------------------------------------------
    async def poll_forever(self, interval_s: float) -> None:
        """Re-scan every `interval_s`; a failed scan (a bug: faults are handled per version) never stops it."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.poll_once()
            except Exception:
                limited.log(logging.ERROR, "poll", "polling %s failed", self.base_path, exc_info=True)
            self.metrics.repository_polls.inc(self.name)  # tests and operators see each poll end

    async def poll_once(self) -> None:
        """Load what the policy wants (newest first), then retire what it no longer wants."""
        try:
            await self._poll()
        finally:  # no await from here to poll_forever's count: a scrape sees polls and requests together
            if self.mirror is not None:
                self.mirror.count_requests()

    async def _poll(self) -> None:
        report = None
        if self.mirror is not None:  # the bucket's half: what the cache folder holds when it returns
            report = await self.mirror.sync(self.policy, set(self.loaded), self.states.failed())
            self._report_bucket(report)
        scan = await asyncio.get_running_loop().run_in_executor(
            self._disk_executor,
            scan_base,
            self.base_path,
            self.states.failed(),
            self.states.due_for_content_check(),
        )
        if report is not None and report.listed is not None:  # deleted from the bucket: deleted here
            scan.versions = {v: p for v, p in scan.versions.items() if v in report.listed}
        self._report_scan(scan)
        if scan.base_error or not scan.versions:
            return  # keep what is loaded: a missing or unreadable base path is more often transient
        skip = {
            v for v in scan.versions if self.states.still_failed(v, scan.stamps.get(v), scan.digests.get(v))
        }
        while True:
            aspired = self.policy.select([v for v in scan.versions if v not in skip])
            to_load = sorted(set(aspired) - set(self.loaded), reverse=True)
            if not to_load or self._too_many_hung():
                break
            if not await self._load(to_load[0], scan.versions[to_load[0]]):
                skip.add(to_load[0])
        for v in sorted(set(self.loaded) - set(aspired)):
            self._retire(self.loaded[v], reason="deleted" if v not in scan.versions else "superseded")
        listed = self.mirror.listed if self.mirror is not None else set()
        self.states.forget_gone(set(scan.versions) | set(scan.entry_errors) | set(self.loaded) | listed)

    def _report_bucket(self, report: SyncReport) -> None:
        """The bucket's versions that wait for their manifest, or were rejected, in the status table."""
        failed = self.states.failed()
        for version, why in report.waiting.items():
            if version not in failed:  # past --manifest_wait_timeout_seconds it fails, as a local folder does
                state = self.states.setdefault(version, VersionState(version))
                self.states.not_ready(state, why, "in the bucket")
        for version, error in report.rejected.items():
            state = self.states.setdefault(version, VersionState(version))
            code = "FAILED_PRECONDITION" if error.reason == BAD_MANIFEST else "DATA_LOSS"
            reason = BAD_MANIFEST if error.reason == BAD_MANIFEST else "hash_mismatch"
            self.states.fail(state, reason, code, str(error), f"in the bucket: {error}")

    def _report_scan(self, scan: Scan) -> None:
        """Log base-path problems when they change (not every poll), odd names once, entry errors once."""
        condition = scan.base_error or ("" if scan.versions or scan.entry_errors else "empty")
        if condition != self._base_condition:
            if condition == "empty":
                log.warning(
                    "no version folders under %s; keeping loaded versions %s",
                    self.base_path,
                    sorted(self.loaded),
                )
            elif condition:
                log.error("%s; keeping loaded versions %s", condition, sorted(self.loaded))
            else:
                log.info("%s lists version folders again", self.base_path)
            self._base_condition = condition
        for name in scan.odd_names:
            if name not in self._names_reported and len(self._names_reported) < MAX_NAMES_REPORTED:
                self._names_reported.add(name)
                log.warning(
                    "ignoring folder %s/%s: a version folder is named by a number from 1 to 2**63-1 with no "
                    "leading zero",
                    self.base_path,
                    name,
                )
        for version, error in scan.entry_errors.items():
            self.states.entry_error(version, error)

    def _too_many_hung(self) -> bool:
        self._hung = [t for t in self._hung if t.is_alive()]
        if len(self._hung) < MAX_HUNG_LOADS:
            return False
        limited.log(
            logging.ERROR,
            "hung",
            "%d model loads are hung; no new load starts until one returns",
            len(self._hung),
        )
        return True

    async def _load(self, version: int, path: Path) -> bool:
        """One load attempt; True when the version became AVAILABLE."""
        state = self.states.setdefault(version, VersionState(version))
        if state.waiting_since is None:
            log.info(
                "loading %s version %d from %s (%s backend)", self.name, version, path, self.backend_kind
            )
        state.state, started = "LOADING", time.perf_counter()
        attempt, thread = await self._loader.load(path, self._load_and_warm, self.load_timeout_s)
        if attempt.timed_out:
            self._hung.append(thread)
            self.metrics.load_failures.inc(self.name)
            self.states.fail(
                state,
                "load_timeout",
                "DEADLINE_EXCEEDED",
                f"not loaded within {self.load_timeout_s:g}s (--model_load_timeout_seconds); the load was abandoned",
                attempt.stamp or "timed out",
            )
            return False
        if attempt.error is not None or attempt.backend is None:
            self.states.settle_failure(state, attempt.error, attempt.stamp, attempt.digest)
            return False
        servable = LoadedVersion(
            version, attempt.backend, self._make_runners(attempt.backend, version), ranges=attempt.ranges
        )
        self.loaded[version] = servable
        self.states.available(state)
        self._refresh_latest()
        log.info(
            "%s version %d available (%d warm-up requests, %.2fs)",
            self.name,
            version,
            attempt.n_warmup,
            time.perf_counter() - started,
        )
        return True

    def _load_and_warm(self, path: Path) -> tuple[Backend, int]:
        # `raw` through the FeatureSpec compiled from the version's spec, when it has one
        # (serving/runtime/spec_backend.py).
        backend = with_spec_transform(load_backend(self.backend_kind, path, self.intra_op_threads), path)
        check_outputs(path, backend.signature.output_names, backend.signature.has_raw)
        return backend, warm_up(backend, path)

    def retire_all(self, reason: str) -> None:
        """Retire every loaded version (the model left the config); each unloads after its last request."""
        for servable in list(self.loaded.values()):
            self._retire(servable, reason)
        self._loader.close()
        if self.mirror is not None:
            self.mirror.close()

    def _retire(self, servable: LoadedVersion, reason: str) -> None:
        log.info(
            "retiring %s version %d (%s); %d requests in flight",
            self.name,
            servable.version,
            reason,
            servable.inflight,
        )
        del self.loaded[servable.version]
        servable.retired = True
        self.states[servable.version].state = "UNLOADING"
        self._refresh_latest()
        if servable.inflight == 0:
            self._unload(servable)

    def _unload(self, servable: LoadedVersion) -> None:
        """Let go of everything of the version (docs/perf/serving-memory.md): its runners, its metric series,
        what the router keeps per version; then check that it is freed and hand its memory back."""
        servable.close()
        self.metrics.forget_version(self.name, servable.version)
        self._watcher.unloaded(servable.version)
        state = self.states.get(servable.version)
        if state is not None and state.state == "UNLOADING":
            state.state = "END"
        log.info("unloaded %s version %d", self.name, servable.version)
        self._reclaimer.unloaded(servable)

    def _refresh_latest(self) -> None:
        self.latest = self.loaded[max(self.loaded)] if self.loaded else None
        self.metrics.model_version.set(float(max(self.loaded, default=0)), self.name)
        self._watcher.versions_changed(self.loaded, self.latest)
