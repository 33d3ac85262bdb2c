"""Read a version folder before trusting it: a change stamp of its files, and its manifest's sha256 check.

Everything here does blocking file I/O and runs off the event loop (the disk executor or a load thread).

A version is complete when `assets.extra/manifest.json` exists, every file it lists under `files`
(`{"model.onnx": "<sha256 hex>", ...}`, relative POSIX paths; the format is `ctr_contract.manifest`) is there
with that hash, and the folder holds no file it does not list. Missing or extra files mean "still being
copied" (VersionNotReady); a listed file whose bytes differ is corruption (HashMismatch). The export stage
writes this manifest (export/publish/manifest.py).

Its `io` block names each signature's outputs (`ctr`, then `raw_score` in versions with a calibrator); a loaded
version's graphs must serve exactly those (`check_outputs`). A manifest without `io` (a hand-built folder)
leaves the graphs to say what they serve.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from ctr_contract.manifest import FILES_KEY, is_listed_path, is_sha256_hex, sha256_file
from ctr_contract.repository import MANIFEST_PATH
from ctr_contract.signatures import RAW_SIGNATURE
from serving.errors import ModelLoadError

MAX_FILES = 10_000  # a version folder holding more entries is refused, not walked forever
MAX_MANIFEST_BYTES = 4 << 20

# One entry per file: (relative path, size, mtime_ns, ctime_ns, inode). ctime is set by the kernel on every
# write and cannot be restored by `cp -p`, `rsync -a` or `touch -d`, so an in-place fix that keeps sizes and
# mtimes still changes the stamp; a replaced file (rsync's rename) changes the inode.
Stamp = tuple[tuple[str, int, int, int, int], ...]


class VersionNotReady(Exception):
    """The version folder is incomplete (still being copied): wait, this is not a failure yet."""


class VersionRejected(Exception):
    """The version folder must not be loaded; `reason` is the metric label, the message names the fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class HashMismatch(VersionRejected):
    """A listed file's bytes differ from the manifest: corrupt, or still being written."""

    def __init__(self, message: str) -> None:
        super().__init__("hash_mismatch", message)


def stamp(version_dir: Path) -> Stamp:
    """The change stamp of every non-directory entry under `version_dir` (symlinks followed, cycles skipped).

    Raises:
        OSError: an entry cannot be read (ELOOP, EACCES, EIO, ENOTDIR, ...), or more than MAX_FILES entries.
    """
    entries: list[tuple[str, int, int, int, int]] = []
    seen_dirs: set[tuple[int, int]] = set()
    pending = [(version_dir, "")]
    while pending:
        folder, prefix = pending.pop()
        info = os.stat(folder)
        if (info.st_dev, info.st_ino) in seen_dirs:
            continue  # a symlink back to a folder already walked
        seen_dirs.add((info.st_dev, info.st_ino))
        with os.scandir(folder) as it:
            for entry in it:
                rel = f"{prefix}{entry.name}"
                st = entry.stat()  # follows symlinks: a dangling or looping link raises here
                if stat.S_ISDIR(st.st_mode):
                    pending.append((Path(entry.path), f"{rel}/"))
                else:
                    entries.append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
                if len(entries) + len(seen_dirs) > MAX_FILES:
                    raise OSError(f"{version_dir} holds more than {MAX_FILES} entries")
    return tuple(sorted(entries))


def content_digest(version_dir: Path, files_stamp: Stamp) -> str:
    """sha256 over every file's path and sha256: a change of bytes that kept every stat field still shows."""
    h = hashlib.sha256()
    for rel, *_ in files_stamp:
        h.update(f"{rel}\0{sha256_file(version_dir / rel)}\n".encode())
    return h.hexdigest()


def listed_files(version_dir: Path) -> dict[str, str]:
    """The manifest's `files` map (relative path -> sha256 hex).

    Raises:
        VersionNotReady: no manifest yet, or it is not complete JSON yet (being copied).
        VersionRejected: the manifest lists no files, or a path outside the folder ("bad_manifest").
    """
    path = version_dir / MANIFEST_PATH
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise VersionNotReady(f"no {MANIFEST_PATH} yet") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise VersionRejected("bad_manifest", f"{MANIFEST_PATH} is over {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:  # a manifest still being written is truncated JSON
        raise VersionNotReady(f"{MANIFEST_PATH} is not complete JSON yet ({exc})") from None
    files = manifest.get(FILES_KEY) if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise VersionRejected(
            "bad_manifest",
            f"{MANIFEST_PATH} has no 'files' map of path -> sha256; re-export the version with `python -m export`",
        )
    for rel, digest in files.items():
        if not is_listed_path(rel):
            raise VersionRejected(
                "bad_manifest", f"{MANIFEST_PATH} lists {rel!r}, not a file inside the version"
            )
        if not is_sha256_hex(digest):
            raise VersionRejected(
                "bad_manifest", f"{MANIFEST_PATH} lists {rel!r} with {digest!r}, not a sha256"
            )
    return files


def verify(version_dir: Path, files_stamp: Stamp) -> None:
    """Check `version_dir` (whose stamp is `files_stamp`) against its manifest; return when it may be loaded.

    Raises:
        VersionNotReady: the manifest, or a file it lists, is missing; or a file it does not list is present.
        HashMismatch: a listed file's sha256 differs from the manifest's (the message names file and digests).
        VersionRejected: the manifest itself is unusable.
        OSError: a file cannot be read.
    """
    files = listed_files(version_dir)
    present = {rel for rel, *_ in files_stamp} - {MANIFEST_PATH}
    missing, extra = sorted(set(files) - present), sorted(present - set(files))
    if missing:
        raise VersionNotReady(
            f"{len(missing)} file(s) listed in {MANIFEST_PATH} are missing, first {missing[0]!r}"
        )
    if extra:
        raise VersionNotReady(
            f"{len(extra)} file(s) not listed in {MANIFEST_PATH} are present, first {extra[0]!r}"
        )
    for rel, expected in sorted(files.items()):
        actual = sha256_file(version_dir / rel)
        if actual != expected:
            raise HashMismatch(f"{rel} has sha256 {actual}, {MANIFEST_PATH} lists {expected}")


def check_outputs(version_dir: Path, served: tuple[str, ...], has_raw: bool) -> None:
    """Refuse a version whose graphs serve other outputs than its manifest's `io` lists (both signatures).

    Args:
        version_dir: the version folder, already verified (its manifest is complete JSON).
        served: the outputs the loaded backend serves (Signature.output_names).
        has_raw: the backend serves the `raw` signature too, whose outputs `io.raw.outputs` lists.
    Raises:
        ModelLoadError: naming both lists, when they differ as sets of names.
    """
    manifest = json.loads((version_dir / MANIFEST_PATH).read_bytes())
    io = manifest.get("io") if isinstance(manifest, dict) else None
    if not isinstance(io, dict):
        return
    raw = io.get(RAW_SIGNATURE)
    blocks = [("io.outputs", io), *([(f"io.{RAW_SIGNATURE}.outputs", raw)] if has_raw else [])]
    for where, block in blocks:
        listed = block.get("outputs") if isinstance(block, dict) else None
        if listed is None:
            continue
        names = list(listed) if isinstance(listed, dict | list) else listed
        if not isinstance(names, list) or sorted(map(str, names)) != sorted(served):
            raise ModelLoadError(
                f"{MANIFEST_PATH} lists outputs {names} in {where}, the version's graphs serve {list(served)}; "
                "re-export the version with `python -m export`"
            )
