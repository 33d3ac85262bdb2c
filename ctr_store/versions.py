"""A model repository in a bucket: `PREFIX/<N>/...` as on disk (ctr_contract.repository), the manifest last.

A version is complete once `PREFIX/<N>/assets.extra/manifest.json` exists: export uploads every other file first
and the manifest with `If-None-Match: *`, so no reader sees a half-published version and no two exports publish
one number. Export first claims its number with a conditional write of `PREFIX/.claims/<N>` (a lock object), so
racing exports never even upload into the same folder. A download checks every object against the manifest's
sha256 and appears at its destination by one rename, complete and checked, or not at all.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from ctr_contract.manifest import FILES_KEY, is_listed_path, is_sha256_hex
from ctr_contract.repository import MANIFEST_PATH, STAGING_PREFIX, parse_version_dir
from ctr_store.errors import HASH_MISMATCH, NOT_FOUND, PRECONDITION, TIMEOUT, StoreError
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath

CLAIMS = ".claims"
MAX_MANIFEST_BYTES = 4 << 20
BAD_MANIFEST = "bad_manifest"


class VersionIncomplete(Exception):
    """The version has no manifest yet: still being uploaded (or abandoned by a failed export)."""


def list_versions(store: ObjectStore, base: BucketPath) -> set[int]:
    """The version numbers under `base`: one delimited listing, whatever the number of objects."""
    return {v for name in store.list_children(base) if (v := parse_version_dir(name)) is not None}


def read_manifest(store: ObjectStore, base: BucketPath, version: int) -> tuple[bytes, dict[str, str]]:
    """The manifest's bytes and its checked `files` map; VersionIncomplete when it does not exist yet."""
    key = base.key(str(version), MANIFEST_PATH)
    try:
        raw = store.get_bytes(base.bucket, key, MAX_MANIFEST_BYTES)
    except StoreError as exc:
        if exc.reason == NOT_FOUND:
            raise VersionIncomplete(f"s3://{base.bucket}/{key} does not exist yet") from None
        raise
    except ValueError as exc:
        raise StoreError(BAD_MANIFEST, str(exc)) from None
    return raw, manifest_files(raw, f"s3://{base.bucket}/{key}")


def manifest_files(raw: bytes, where: str) -> dict[str, str]:
    """The checked `files` map of a manifest's bytes; StoreError("bad_manifest") naming `where` if malformed."""
    try:
        files = json.loads(raw)[FILES_KEY]
        ok = isinstance(files, dict) and all(is_listed_path(k) and is_sha256_hex(v) for k, v in files.items())
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise StoreError(
            BAD_MANIFEST,
            f"{where} is not a manifest: it needs a `files` object of relative paths to sha256 hex",
        )
    return files


def download_version(
    store: ObjectStore,
    base: BucketPath,
    version: int,
    dest: Path,
    workers: int = 8,
    deadline_s: float = 600.0,
    manifest: bytes | None = None,
) -> bytes:
    """Download version `version` into the folder `dest` (which must not exist), checked; returns the manifest.

    Objects download in parallel into a hidden staging folder beside `dest`, each hashed as it streams; a
    mismatch (the object changed or was replaced mid-download), a vanished object, a fault or the deadline
    removes the staging folder and raises StoreError. Memory: one 1 MiB chunk per download thread. `manifest`:
    its bytes when the caller has read them already.
    """
    if manifest is None:
        raw, files = read_manifest(store, base, version)
    else:  # read by the caller already: one GET less (an object changed since fails its sha256 below)
        raw, files = (
            manifest,
            manifest_files(manifest, f"s3://{base.bucket}/{base.key(str(version), MANIFEST_PATH)}"),
        )
    staging = dest.parent / f"{STAGING_PREFIX}{version}-{secrets.token_hex(4)}-{os.getpid()}"
    stop = threading.Event()

    def fetch(rel: str) -> None:
        if stop.is_set():
            return
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        got = store.download(base.bucket, base.key(str(version), rel), target)
        if got != files[rel]:
            raise StoreError(
                HASH_MISMATCH,
                f"s3://{base.bucket}/{base.key(str(version), rel)} has sha256 {got}, its manifest says "
                f"{files[rel]}: the object changed after it was published, or was corrupted",
            )

    staging.mkdir(parents=True)
    try:
        with ThreadPoolExecutor(max(1, min(workers, len(files))), thread_name_prefix="s3-get") as pool:
            futures = [pool.submit(fetch, rel) for rel in sorted(files)]
            done, pending = wait(futures, timeout=deadline_s, return_when=FIRST_EXCEPTION)
            stop.set()
            for f in pending:
                f.cancel()
            for f in done:
                if f.exception() is not None:
                    raise f.exception()  # type: ignore[misc]
            if pending:
                raise StoreError(
                    TIMEOUT,
                    f"s3://{base.bucket}/{base.key(str(version))}/ not downloaded within {deadline_s:g}s",
                )
        (staging / MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
        (staging / MANIFEST_PATH).write_bytes(raw)
        os.rename(staging, dest)
    finally:
        stop.set()
        shutil.rmtree(staging, ignore_errors=True)
    return raw


def claim_version(store: ObjectStore, base: BucketPath, owner: str, requested: int | None = None) -> int:
    """Claim a version number no other export will publish: `requested`, or the next after every published
    and claimed one. A conditional write of `.claims/<N>`; a lost race moves on to N+1."""
    claims = base.child(CLAIMS)
    taken = list_versions(store, base)
    taken |= {v for key, _ in store.list_objects(claims) if (v := parse_version_dir(key.rsplit("/", 1)[-1]))}
    n = requested if requested is not None else max(taken, default=0) + 1
    while True:
        if n not in taken and store.put_bytes(
            base.bucket, claims.key(str(n)), owner.encode(), if_absent=True
        ):
            return n
        if requested is not None:
            raise StoreError(PRECONDITION, f"version {n} already exists or is claimed in {base}")
        n += 1


def upload_version(
    store: ObjectStore, base: BucketPath, version: int, source: Path, workers: int = 8
) -> None:
    """Upload the complete local version folder `source` as `base/<version>/` (claimed first), the manifest
    last and only if absent. On a failure before the manifest the objects are deleted again, so nothing a
    server would load is left, and the claim stays (the number is never reused)."""
    files = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    if MANIFEST_PATH not in files:
        raise ValueError(f"{source} has no {MANIFEST_PATH}")
    others = [rel for rel in files if rel != MANIFEST_PATH]

    def put(rel: str) -> None:
        store.upload(base.bucket, base.key(str(version), rel), source / rel)

    try:
        with ThreadPoolExecutor(max(1, min(workers, len(others))), thread_name_prefix="s3-put") as pool:
            list(pool.map(put, others))
    except BaseException:
        store.delete(base.bucket, [base.key(str(version), rel) for rel in others])
        raise
    manifest = (source / MANIFEST_PATH).read_bytes()
    if not store.put_bytes(base.bucket, base.key(str(version), MANIFEST_PATH), manifest, if_absent=True):
        raise StoreError(PRECONDITION, f"version {version} was published in {base} by another writer")


def delete_version(store: ObjectStore, base: BucketPath, version: int) -> None:
    """Remove a version: its manifest first (readers stop seeing it at once), then the rest, then its claim."""
    store.delete(base.bucket, [base.key(str(version), MANIFEST_PATH)])
    keys = [k for k, _ in store.list_objects(base.child(str(version)))]
    if keys:
        store.delete(base.bucket, keys)
    store.delete(base.bucket, [base.key(CLAIMS, str(version))])
