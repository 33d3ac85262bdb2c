"""The versioned model repository: numbered version folders, atomic publish, retention, Triton config.

Layout (`ctr_contract.repository`, docs/design.md): `<base>/config.pbtxt` and `<base>/<N>/...`. A version is written complete under
`<base>/.tmp-<N>-<host>-<token>-<pid>` (servers ignore non-numeric names) and then renamed into place; the
export holds `<that>.lock` meanwhile (export/publish/staging_lock.py), so a later export removes a crashed one's folder.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ctr_contract.repository import MAX_VERSION, ONNX_MODEL, STAGING_PREFIX, TRITON_CONFIG, version_dirs
from export.errors import PublishError
from export.publish import staging_lock

log = logging.getLogger(__name__)

TRITON_MAX_BATCH = 1024


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _abandoned(staging: Path) -> bool:
    """Is `staging` left by a crashed export? Its lock file says; without one, the PID in its name does.

    Folders without a lock (retention's `delete-V-PID`) are abandoned when that PID is gone or is this
    process's own: this export has created none yet, and in a container the dead export was PID 1 too.
    """
    lock = staging_lock.lock_path(staging)
    if lock.exists():
        return staging_lock.abandoned(lock)
    pid = staging.name.rsplit("-", 1)[-1]
    return pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid)))


class ModelRepository:
    """One model's base path (e.g. artifacts/models/ctr) holding numbered version folders."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @property
    def name(self) -> str:
        return self.base.resolve().name

    def versions(self) -> list[int]:
        """Published versions, ascending (numeric folder names only)."""
        if not self.base.is_dir():
            return []
        return sorted(version_dirs(self.base))

    def choose_version(self, requested: int | None) -> int:
        """The requested version if free, else the next after the highest published one."""
        existing = self.versions()
        if requested is None:
            return (existing[-1] + 1) if existing else 1
        if not 1 <= requested <= MAX_VERSION:
            raise PublishError(f"--version must be an integer in 1..{MAX_VERSION}, got {requested}")
        if requested in existing:
            raise PublishError(
                f"version {requested} already exists in {self.base}; versions are never overwritten "
                f"(omit --version to publish {existing[-1] + 1})"
            )
        return requested

    def location(self, version: int) -> Path:
        return self.base / str(version)

    def close(self) -> None:
        """Nothing to release (BucketRepository removes its local work folder)."""

    def claim(self, requested: int | None, chosen: int) -> int:
        """The version `chosen` stays: a local publish is one rename, which refuses a taken number itself."""
        return chosen

    def newest_local(self) -> Path | None:
        """The newest published version's folder (the quality gate's served version), or None."""
        versions = version_dirs(self.base) if self.base.is_dir() else {}
        return versions[max(versions)] if versions else None

    def prepare(self) -> None:
        """Create the base path and prove it is writable; drop staging folders of dead exports."""
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            probe = self.base / f"{STAGING_PREFIX}probe-{os.getpid()}"
            probe.mkdir()
            probe.rmdir()
        except OSError as e:
            raise PublishError(f"model repository {self.base} is not writable: {e}") from e
        for p in self.base.glob(f"{STAGING_PREFIX}*"):
            if p.name.endswith(staging_lock.LOCK_SUFFIX):
                folder = p.with_name(p.name.removesuffix(staging_lock.LOCK_SUFFIX))
                if not folder.exists() and staging_lock.abandoned(p):
                    p.unlink(missing_ok=True)  # its export crashed after publishing or removing its folder
                continue
            if p.is_dir() and _abandoned(p):
                log.warning("removing staging folder %s left by a crashed export", p)
                shutil.rmtree(p)
                staging_lock.lock_path(p).unlink(missing_ok=True)

    @contextmanager
    def staging(self, version: int) -> Iterator[Path]:
        """A fresh hidden folder for version `version`, removed again if anything inside fails."""
        # Host and a random token too: exports in two containers are both PID 1 and may share the volume.
        tmp = (
            self.base
            / f"{STAGING_PREFIX}{version}-{socket.gethostname()}-{secrets.token_hex(4)}-{os.getpid()}"
        )
        try:
            lock = staging_lock.hold(tmp)
        except OSError as e:
            raise PublishError(f"cannot create staging lock {staging_lock.lock_path(tmp)}: {e}") from e
        try:
            try:
                tmp.mkdir()
            except OSError as e:
                raise PublishError(f"cannot create staging folder {tmp}: {e}") from e
            yield tmp
        finally:
            if tmp.exists():  # not renamed: an error happened before or during publish
                shutil.rmtree(tmp, ignore_errors=False)
            staging_lock.release(tmp, lock)

    def publish(self, staged: Path, version: int) -> Path:
        """Rename the complete staged folder to `<base>/<version>`; never replaces an existing version."""
        final = self.base / str(version)
        if final.exists():
            raise PublishError(f"version {version} appeared in {self.base} during export; not overwriting it")
        try:
            os.rename(staged, final)  # atomic within one filesystem: pollers see all of it or nothing
        except OSError as e:
            raise PublishError(f"cannot publish {staged} as {final}: {e}") from e
        return final

    def retain(self, keep: int, protect: int) -> list[int]:
        """Delete all but the newest `keep` versions (never `protect`); returns the removed versions."""
        doomed = [v for v in self.versions()[:-keep] if v != protect] if keep > 0 else []
        for v in doomed:
            # Rename first so a polling server sees the version vanish at once, not file by file.
            gone = self.base / f"{STAGING_PREFIX}delete-{v}-{os.getpid()}"
            os.rename(self.base / str(v), gone)
            shutil.rmtree(gone)
        return doomed

    def write_triton_config(self, width: int, input_name: str, output_names: Sequence[str]) -> Path:
        """Write `<base>/config.pbtxt` for Triton's onnxruntime backend (atomically)."""
        path = self.base / TRITON_CONFIG
        tmp = path.with_name(f"{STAGING_PREFIX}config-{os.getpid()}")
        tmp.write_text(triton_config_text(self.name, width, input_name, output_names))
        os.replace(tmp, path)
        return path


def triton_config_text(model: str, width: int, input_name: str, output_names: Sequence[str]) -> str:
    """Triton's config.pbtxt for the onnxruntime backend: one input, and one output entry per name (ctr,
    raw_score)."""
    outputs = ",\n".join(
        f"""  {{
    name: "{name}"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }}"""
        for name in output_names
    )
    return f"""name: "{model}"
platform: "onnxruntime_onnx"
default_model_filename: "{ONNX_MODEL}"
max_batch_size: {TRITON_MAX_BATCH}
input [
  {{
    name: "{input_name}"
    data_type: TYPE_FP32
    dims: [ {width} ]
  }}
]
output [
{outputs}
]
dynamic_batching {{
  preferred_batch_size: [ 64, 256 ]
  max_queue_delay_microseconds: 500
}}
version_policy: {{ latest {{ num_versions: 1 }} }}
"""
