"""The model repository in a bucket (`--repo s3://BUCKET/PREFIX`): ModelRepository's steps over ctr_store.

The version is staged and gated in a local temporary folder as for a local repository. Only then does the
export claim its number: a conditional write of `PREFIX/.claims/<N>` (ctr_store/versions.py), the number being
the next after every published and claimed one, so two exports racing never upload into the same folder.
It uploads every object, then the manifest last with `If-None-Match: *`: a server sees the whole version or
none of it. A failed upload removes the objects it wrote (when the store still answers) and writes no
manifest; the claim stays, so the number is never reused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ctr_contract.repository import MAX_VERSION, TRITON_CONFIG, parse_version_dir
from ctr_store.errors import PRECONDITION, StoreError
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath, is_bucket_path
from ctr_store.versions import (
    CLAIMS,
    VersionIncomplete,
    claim_version,
    delete_version,
    download_version,
    list_versions,
    read_manifest,
    upload_version,
)
from export.errors import PublishError
from export.publish.repository import ModelRepository, triton_config_text

log = logging.getLogger(__name__)


def repo_location(text: str) -> Path | str:
    """`--repo`'s type: an s3:// URL stays a string (a Path would fold `s3://` into `s3:/`), else a Path."""
    return text if is_bucket_path(text) else Path(text)


def open_repository(repo: Path | str) -> ModelRepository | BucketRepository:
    """The repository `--repo` names: a bucket for `s3://BUCKET/PREFIX`, else a local base path."""
    return BucketRepository(str(repo)) if is_bucket_path(repo) else ModelRepository(Path(repo))


def _fault(exc: BaseException) -> BaseException:
    """The first fault of a chain: a clean-up that failed too (the store went away) hides the one that counts."""
    first, seen = exc, exc.__context__
    while seen is not None:
        if isinstance(seen, StoreError):
            first = seen
        seen = seen.__context__
    return first


class BucketRepository:
    """One model's base path in a bucket, e.g. s3://models/prod/ctr; `close()` removes the local work folder."""

    def __init__(self, url: str, store: ObjectStore | None = None) -> None:
        try:
            self.base = BucketPath.parse(url)
        except ValueError as e:
            raise PublishError(f"--repo {url}: {e}") from None
        if not self.base.prefix:
            raise PublishError(
                f"--repo {url} names no model base path; expected s3://BUCKET/PREFIX, e.g. s3://{self.base.bucket}/ctr"
            )
        try:
            self.store = store or ObjectStore()
        except Exception as e:  # boto3 refuses the configuration itself, e.g. a malformed AWS_ENDPOINT_URL
            raise PublishError(f"cannot make a client for {self.base}: {e}") from None
        self.work = Path(tempfile.mkdtemp(prefix="ctr-export-"))

    @property
    def name(self) -> str:
        return self.base.name

    def location(self, version: int) -> str:
        return f"{self.base}/{version}"

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def prepare(self) -> None:
        """Prove the bucket exists and the credentials reach it: one request, before any slow step."""
        try:
            self.store.check_bucket(self.base)
        except StoreError as e:
            raise PublishError(
                f"model repository {self.base} ({self.store.config.describe()}): {e}"
            ) from None

    def _taken(self) -> set[int]:
        """Every number in use: version folders (published or being uploaded) and claims."""
        names = (key.rsplit("/", 1)[-1] for key, _ in self.store.list_objects(self.base.child(CLAIMS)))
        claims = {v for name in names if (v := parse_version_dir(name)) is not None}
        return list_versions(self.store, self.base) | claims

    def versions(self) -> list[int]:
        """Published versions, ascending: those whose manifest exists (one GET each)."""
        out = []
        for v in sorted(list_versions(self.store, self.base)):
            try:
                read_manifest(self.store, self.base, v)
            except VersionIncomplete:
                continue  # being uploaded by another export, or left by one whose store went away
            out.append(v)
        return out

    def choose_version(self, requested: int | None) -> int:
        """The number this export expects: `requested` if free, else the next one. Claimed only after the gates
        (`claim`), so a refused or failed candidate uses up no number."""
        if requested is not None and not 1 <= requested <= MAX_VERSION:
            raise PublishError(f"--version must be an integer in 1..{MAX_VERSION}, got {requested}")
        try:
            taken = self._taken()
        except StoreError as e:
            raise PublishError(f"cannot list {self.base}: {e}") from None
        if requested is None:
            return max(taken, default=0) + 1
        if requested in taken:
            raise PublishError(
                f"version {requested} already exists or is claimed in {self.base}; versions are never "
                f"overwritten (omit --version to publish {max(taken) + 1})"
            )
        return requested

    def claim(self, requested: int | None, chosen: int) -> int:
        """Claim the version number by a conditional write of `.claims/<N>`; returns it (`chosen` unless another
        export took that one meanwhile)."""
        owner = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})
        try:
            version = claim_version(self.store, self.base, owner, requested)
        except StoreError as e:
            if e.reason == PRECONDITION:
                raise PublishError(
                    f"version {requested} was claimed in {self.base} by another export meanwhile; not "
                    "overwriting it (omit --version to publish the next number)"
                ) from None
            raise PublishError(f"cannot claim a version number in {self.base}: {e}") from None
        if version != chosen:
            log.info("version %d was taken meanwhile: publishing as version %d", chosen, version)
        return version

    @contextmanager
    def staging(self, version: int) -> Iterator[Path]:
        """A fresh local folder for the version, removed once it is uploaded or has failed."""
        stage = self.work / f"stage-{version}"
        stage.mkdir()
        try:
            yield stage
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def publish(self, staged: Path, version: int) -> str:
        """Upload the complete staged folder as `<base>/<version>/`, the manifest last; returns its URL."""
        try:
            upload_version(self.store, self.base, version, staged)
        except (StoreError, OSError) as e:
            self._remove_partial(version)
            raise PublishError(
                f"cannot upload version {version} to {self.base}: {_fault(e)}; nothing was published (no "
                f"manifest), and {self.base}/{CLAIMS}/{version} keeps the number from being reused"
            ) from None
        return self.location(version)

    def _remove_partial(self, version: int) -> None:
        """Best effort: objects a failed upload left (its own clean-up may have met the same fault)."""
        try:
            keys = [k for k, _ in self.store.list_objects(self.base.child(str(version)))]
            if keys:
                self.store.delete(self.base.bucket, keys)
        except StoreError as e:
            log.warning(
                "cannot remove the objects of the failed version %d (%s); without a manifest no server loads them",
                version,
                e,
            )

    def retain(self, keep: int, protect: int) -> list[int]:
        """Delete all but the newest `keep` published versions (never `protect`); returns the removed ones.

        Only versions with a manifest count: a folder without one may be another export's upload in progress.
        """
        try:
            published = self.versions()
            doomed = [v for v in published[:-keep] if v != protect] if keep > 0 else []
            for v in doomed:
                delete_version(self.store, self.base, v)  # the manifest first: servers stop seeing it at once
        except StoreError as e:
            raise PublishError(f"retention in {self.base}: {e}") from None
        return doomed

    def newest_local(self) -> Path | None:
        """The newest published version downloaded (checked) into the work folder, for the quality gate."""
        try:
            for v in sorted(list_versions(self.store, self.base), reverse=True):
                dest = self.work / "served" / str(v)
                dest.parent.mkdir(exist_ok=True)
                try:
                    download_version(self.store, self.base, v, dest)
                except VersionIncomplete:
                    continue
                return dest
        except StoreError as e:
            raise PublishError(
                f"cannot download the newest version of {self.base} for the quality gate: {e}"
            ) from None
        return None

    def write_triton_config(self, width: int, input_name: str, output_names: Sequence[str]) -> str:
        """Write `<base>/config.pbtxt` (Triton's model config) as one object; returns its URL."""
        text = triton_config_text(self.name, width, input_name, output_names)
        try:
            self.store.put_bytes(self.base.bucket, self.base.key(TRITON_CONFIG), text.encode())
        except StoreError as e:
            raise PublishError(f"cannot write {self.base}/{TRITON_CONFIG}: {e}") from None
        return f"{self.base}/{TRITON_CONFIG}"
