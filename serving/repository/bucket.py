"""A model base path in a bucket (`s3://BUCKET/PREFIX/ctr`), mirrored into `--model_cache_dir/<model>/`.

Each poll lists the version prefixes (one delimited LIST, whatever the number of objects), reads the manifest
of a version the policy wants that it has not seen complete (one GET; a prefix without a manifest is still
being uploaded: it waits), downloads each wanted version that is not cached (ctr_store.versions: objects in
parallel, each checked against the manifest's sha256, the folder appearing by one rename), and removes the
cached versions the policy no longer wants once the manager has let them go. The manager then scans and loads
the cache folder as a local base path (serving/repository/manager.py), so every local rule holds there too.

A version whose download fails for its own bytes (an object that changed or vanished, a manifest that is no
manifest), or that the manager failed to load from the cache, is rejected: never served, and its manifest is
read again once a minute; only a new manifest makes it a candidate again. A store fault (unreachable, slow,
denied) fails the poll alone: the cache, and so what is loaded, stays as it was, and the next poll tries again.

The cache outlives the process: a cached version is compared with the bucket's manifest (one GET) the first
time this process sees it, and loaded without downloading again when equal. The workers of `--num_workers`
share it: downloads and removals happen under an flock of `<cache>/.lock`, so the first worker downloads a
version and the others find it renamed into place. docs/serving-versions.md, "Object storage", has the costs.

The store calls block: they run on the mirror's own thread, never on the event loop or the scan thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ctr_contract.repository import MANIFEST_PATH, STAGING_PREFIX, parse_version_dir
from ctr_store.errors import ERROR, HASH_MISMATCH, NOT_FOUND, StoreError, classify
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath, is_bucket_path
from ctr_store.versions import BAD_MANIFEST, VersionIncomplete, download_version, list_versions, read_manifest
from serving.observability.metrics import ServingMetrics
from serving.observability.store_metrics import STORE_ERROR_REASONS, STORE_REQUEST_KINDS
from serving.repository.policy import VersionPolicy

log = logging.getLogger("serving.repository.manager")
BasePath = Path | BucketPath  # a model's base path: a local folder, or a prefix in a bucket
RECHECK_S = 60.0  # a rejected version's manifest (and a long-waiting prefix's) is read again this often
DOWNLOAD_THREADS = 8  # parallel GETs of one version's objects
VERSION_FAULTS = (HASH_MISMATCH, NOT_FOUND, BAD_MANIFEST)  # the version's own bytes, not the store's health
LOCK_NAME = ".lock"


def parse_base_path(text: str) -> BasePath:
    """`s3://BUCKET/PREFIX` -> BucketPath, anything else -> Path; ValueError names a malformed s3 path."""
    return BucketPath.parse(text) if is_bucket_path(text) else Path(text)


@dataclass
class SyncReport:
    """What one poll of the bucket found, for the manager's status table."""

    listed: set[int] | None = None  # the versions in the bucket; None when the listing failed
    fault: StoreError | None = None  # the store fault that ended the poll (nothing in the cache changed)
    waiting: dict[int, str] = field(default_factory=dict)  # wanted prefixes without a manifest yet
    rejected: dict[int, StoreError] = field(default_factory=dict)  # versions rejected by this poll
    downloaded: list[int] = field(default_factory=list)


@dataclass
class _Rejection:
    manifest_sha: str  # of the manifest it was rejected with ("" when the manifest itself was unreadable)
    checked: float  # monotonic time of the last look at the bucket's manifest


class BucketMirror:
    """One model's bucket prefix and its cache folder; `sync` is the bucket's half of a poll."""

    def __init__(
        self,
        model: str,
        base: BucketPath,
        cache: Path,
        metrics: ServingMetrics,
        download_timeout_s: float = 600.0,
        manifest_wait_s: float = 600.0,
        store: ObjectStore | None = None,
    ) -> None:
        self.model, self.base, self.cache, self.metrics = model, base, cache, metrics
        self.download_timeout_s, self.manifest_wait_s = download_timeout_s, manifest_wait_s
        self._store = store  # made on the mirror's thread at its first poll (boto3 reads its files then)
        self.manifests: dict[int, bytes] = {}  # complete versions: their manifest as the bucket holds it
        # Prefixes without a manifest yet: version -> (first seen, last read), monotonic.
        self.waiting: dict[int, tuple[float, float]] = {}
        self.rejected: dict[int, _Rejection] = {}
        self.validated: set[int] = set()  # cached versions whose manifest equals the bucket's
        self.listed: set[int] = set()  # the last listing that succeeded
        self.outage: str | None = None  # the current outage's reason (logged once, and once when it ends)
        self._requests: Counter[str] = Counter()  # store requests already counted in the metric
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"bucket-{model}")
        self._lock = asyncio.Lock()
        for reason in STORE_ERROR_REASONS:  # at 0 from start-up: alerts take increase() of them
            metrics.repository_errors.inc(model, reason, amount=0)
        for kind in STORE_REQUEST_KINDS:
            metrics.repository_store_requests.inc(model, kind, amount=0)

    async def sync(self, policy: VersionPolicy, loaded: set[int], failed: set[int]) -> SyncReport:
        """List, read new manifests, download and prune, off the event loop; count and log the outcome.

        Args:
            loaded: the versions the manager holds now (never removed from the cache).
            failed: the versions the manager failed (a cached one among them is rejected, see above).
        """
        async with self._lock:
            loop = asyncio.get_running_loop()
            report = await loop.run_in_executor(self._thread, self._sync, policy, loaded, failed)
        self._account(report)
        return report

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = ObjectStore()
            except Exception as exc:  # e.g. a malformed endpoint URL in the environment
                raise classify(exc, f"a client for s3://{self.base.bucket}") from None
        return self._store

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    # --- on the event loop --------------------------------------------------------------------
    def count_requests(self) -> None:
        """Add the store requests made since the last call to the metric (the manager calls it as each poll
        ends, in the event loop's step that counts ctr_serving_repository_polls_total: a scrape sees both)."""
        made = (self._store.requests if self._store else Counter()) - self._requests
        self._requests.update(made)
        for kind, n in made.items():
            self.metrics.repository_store_requests.inc(self.model, kind, amount=n)

    def _account(self, report: SyncReport) -> None:
        """Count the faults met; log an outage once, and its end once."""
        for error in report.rejected.values():
            self.metrics.repository_errors.inc(self.model, error.reason)
        if report.fault is not None:
            self.metrics.repository_errors.inc(self.model, report.fault.reason)
            if self.outage is None:
                log.error(
                    "%s: cannot poll s3://%s (%s): %s; the cached versions keep serving, retrying every poll",
                    self.model,
                    self.base.bucket,
                    report.fault.reason,
                    report.fault,
                )
            self.outage = report.fault.reason
        elif self.outage is not None:
            log.info("%s: s3://%s answers again", self.model, self.base.bucket)
            self.outage = None

    # --- on the mirror's thread ---------------------------------------------------------------
    def _sync(self, policy: VersionPolicy, loaded: set[int], failed: set[int]) -> SyncReport:
        report = SyncReport()
        try:
            self._reject_failed_loads(failed)
            report.listed = list_versions(self.store, self.base)
            self.listed = set(report.listed)
            for known in (self.manifests, self.waiting, self.rejected):
                for v in [v for v in known if v not in report.listed]:
                    del known[v]  # gone from the bucket: a new version with its number starts afresh
            self._recheck_rejected(report.listed)
            wanted = self._wanted(policy, report)
            self._apply(wanted, loaded, report)
        except StoreError as exc:
            report.fault = exc
        except OSError as exc:  # the cache folder: unwritable, full
            report.fault = StoreError(ERROR, f"the cache folder {self.cache}: {exc}")
        return report

    def _cached(self) -> dict[int, Path]:
        try:
            entries = list(os.scandir(self.cache))
        except FileNotFoundError:
            return {}
        found = ((parse_version_dir(e.name), e) for e in entries)
        return {v: Path(e.path) for v, e in found if v is not None and e.is_dir()}

    def _reject_failed_loads(self, failed: set[int]) -> None:
        """A cached version the manager failed stays unloaded until the bucket holds another manifest for it."""
        for v, path in self._cached().items():
            if v in failed and v not in self.rejected:
                try:
                    sha = hashlib.sha256((path / MANIFEST_PATH).read_bytes()).hexdigest()
                except OSError:
                    sha = ""
                self.rejected[v] = _Rejection(sha, time.monotonic())

    def _recheck_rejected(self, listed: set[int]) -> None:
        now = time.monotonic()
        for v, rejection in list(self.rejected.items()):
            if v not in listed or now - rejection.checked < RECHECK_S:
                continue
            rejection.checked = now
            try:
                raw, _ = read_manifest(self.store, self.base, v)
            except VersionIncomplete:
                raw = b""  # being published again
            except StoreError as exc:
                if exc.reason != BAD_MANIFEST:
                    raise
                continue
            if hashlib.sha256(raw).hexdigest() != rejection.manifest_sha:
                log.info("%s version %d has a new manifest in %s; trying it again", self.model, v, self.base)
                del self.rejected[v]
                self.manifests.pop(v, None)

    def _wanted(self, policy: VersionPolicy, report: SyncReport) -> list[int]:
        """The versions the policy wants among the complete ones, reading the manifests of those not seen yet
        (newest first: `latest:N` reads N of them, whatever the number of older versions)."""
        assert report.listed is not None
        now = time.monotonic()
        candidates = sorted(v for v in report.listed if v not in self.rejected)
        skipped: set[int] = set()
        while True:
            wanted = policy.select([v for v in candidates if v not in skipped])
            unknown = sorted((v for v in wanted if v not in self.manifests), reverse=True)
            if not unknown:
                return wanted
            for v in unknown:
                first, last = self.waiting.get(v, (now, 0.0))
                overdue = self.manifest_wait_s and now - first >= self.manifest_wait_s
                key = self.base.key(str(v), MANIFEST_PATH)
                why = f"no s3://{self.base.bucket}/{key} yet: still being uploaded"
                if overdue and now - last < RECHECK_S:
                    skipped.add(v)  # waited long: read once a minute only
                    report.waiting[v] = why
                    continue
                try:
                    raw, _ = read_manifest(self.store, self.base, v)
                except VersionIncomplete:
                    self.waiting[v] = (first, now)
                    skipped.add(v)
                    report.waiting[v] = why
                    continue
                except StoreError as exc:
                    if exc.reason != BAD_MANIFEST:
                        raise
                    self.rejected[v] = _Rejection("", now)
                    report.rejected[v] = exc
                    skipped.add(v)
                    continue
                self.waiting.pop(v, None)
                self.manifests[v] = raw

    def _apply(self, wanted: list[int], loaded: set[int], report: SyncReport) -> None:
        """Make the cache hold the wanted versions (and the loaded ones): download, replace stale, remove."""
        cached = self._cached()
        stale = set()
        for v in set(wanted) & set(cached) - self.validated:
            try:
                same = (cached[v] / MANIFEST_PATH).read_bytes() == self.manifests[v]
            except OSError:
                same = False
            if same:
                self.validated.add(v)
            elif v not in loaded:
                log.warning(
                    "%s version %d in the cache differs from %s; downloading it again",
                    self.model,
                    v,
                    self.base,
                )
                stale.add(v)
        fetch = [v for v in sorted(wanted, reverse=True) if v not in cached or v in stale]
        remove = [v for v in cached if (v not in wanted and v not in loaded) or v in stale]
        if not fetch and not remove:
            return  # the usual poll: nothing to write
        with self._cache_lock():
            for v in remove:
                self._remove(v)
            for v in fetch:
                if (self.cache / str(v)).exists():
                    continue  # another worker downloaded it meanwhile
                self._download(v, report)

    def _download(self, v: int, report: SyncReport) -> None:
        started = time.perf_counter()
        log.info("%s: downloading version %d from %s", self.model, v, self.base)
        try:
            raw = download_version(
                self.store,
                self.base,
                v,
                self.cache / str(v),
                DOWNLOAD_THREADS,
                self.download_timeout_s or threading.TIMEOUT_MAX,  # 0: no limit
                self.manifests.get(v),  # read by _wanted this poll: no second GET
            )
        except VersionIncomplete:
            self.manifests.pop(v, None)  # its manifest was deleted since: no longer a version
            return
        except StoreError as exc:
            if exc.reason not in VERSION_FAULTS:
                raise  # the store's fault: this poll fails, the next one tries again
            sha = hashlib.sha256(self.manifests.get(v, b"")).hexdigest()
            self.rejected[v] = _Rejection(sha, time.monotonic())
            report.rejected[v] = exc
            return
        self.manifests[v] = raw
        self.validated.add(v)
        report.downloaded.append(v)
        log.info("%s: version %d downloaded in %.2fs", self.model, v, time.perf_counter() - started)

    def _remove(self, v: int) -> None:
        """Rename out of the way (gone from scans at once), then delete."""
        doomed = self.cache / f"{STAGING_PREFIX}delete-{v}-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.cache / str(v), doomed)
            log.info("%s: version %d removed from the cache %s", self.model, v, self.cache)
        shutil.rmtree(doomed, ignore_errors=True)
        self.validated.discard(v)

    @contextlib.contextmanager
    def _cache_lock(self) -> Iterator[None]:
        """Exclusive use of the cache among the processes sharing it; what a dead holder left is removed."""
        self.cache.mkdir(parents=True, exist_ok=True)
        with (self.cache / LOCK_NAME).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by close, or by the kernel if the holder dies
            for entry in os.scandir(self.cache):
                if entry.name.startswith(STAGING_PREFIX):  # staging of a process that died mid-download
                    shutil.rmtree(entry.path, ignore_errors=True)
            yield
