"""The versions under the model's base path as the controller sees them: folders on disk, or prefixes in a
bucket (`s3://BUCKET/PREFIX`, ctr_store), each with the check the controller makes before it lists one.

On disk a version is checked as the server checks it (its manifest's sha256 of every file). In a bucket the
controller does not download a version to hash it: it reads the manifest (one GET) and lists the version's
objects (one LIST), so a version with a missing object is never listed; the server checks every object's
sha256 as it downloads it, and a version it rejects is rolled back as one that failed to load.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ctr_contract.repository import MANIFEST_PATH, version_dirs
from ctr_store.errors import StoreError
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import BAD_MANIFEST, VersionIncomplete, list_versions, read_manifest
from serving.repository.bucket import BasePath
from serving.repository.manifest_check import VersionNotReady, VersionRejected, stamp, verify
from serving.repository.model_config import shared_store


def check_files(version_dir: Path) -> tuple[str, str]:
    """("ok", ""), ("not_ready", why) while it is being copied, or ("corrupt", why): the manifest check."""
    try:
        verify(version_dir, stamp(version_dir))
    except VersionNotReady as exc:
        return "not_ready", str(exc)
    except VersionRejected as exc:
        return "corrupt", str(exc)
    except OSError as exc:
        return "not_ready", f"cannot read it: {exc}"
    return "ok", ""


class Versions:
    """The version numbers under `base` (listed once, when made), and the controller's checks of one.

    Raises StoreError (when made, or from a check) when a bucket cannot be read.
    """

    def __init__(self, base: BasePath, store: ObjectStore | None = None) -> None:
        self.base = base
        self._dirs: dict[int, Path] = {}
        self._files: dict[int, dict[str, str] | None] = {}  # a bucket version's manifest; None: none yet
        if isinstance(base, Path):
            self._dirs = version_dirs(base)
            self.numbers = set(self._dirs)
        else:
            self.store = store or shared_store()
            self.numbers = list_versions(self.store, base)

    def __contains__(self, version: object) -> bool:
        return version in self.numbers

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.numbers))

    def complete(self, version: int) -> bool:
        """Whether its manifest exists (export writes it last)."""
        if isinstance(self.base, Path):
            return (self._dirs[version] / MANIFEST_PATH).exists()
        try:
            return self._manifest(self.base, version) is not None
        except StoreError as exc:
            if exc.reason != BAD_MANIFEST:
                raise
            return True  # there, but no manifest: `check` calls it corrupt

    def check(self, version: int) -> tuple[str, str]:
        """("ok", ""), ("not_ready", why) or ("corrupt", why)."""
        if isinstance(self.base, Path):
            return check_files(self._dirs[version])
        try:
            files = self._manifest(self.base, version)
        except StoreError as exc:
            if exc.reason != BAD_MANIFEST:
                raise
            return "corrupt", str(exc)
        if files is None:
            return "not_ready", f"no {MANIFEST_PATH} in {self.base}/{version} yet"
        prefix = self.base.key(str(version)) + "/"
        present = {key[len(prefix) :] for key, _ in self.store.list_objects(self.base.child(str(version)))}
        missing = sorted(set(files) - present)
        if missing:
            return "corrupt", f"{len(missing)} object(s) its manifest lists are missing, first {missing[0]!r}"
        return "ok", ""

    def _manifest(self, base: BucketPath, version: int) -> dict[str, str] | None:
        if version not in self._files:
            try:
                self._files[version] = read_manifest(self.store, base, version)[1]
            except VersionIncomplete:
                self._files[version] = None
        return self._files[version]
