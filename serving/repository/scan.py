"""One scan of `--model_base_path`: which version folders exist, and the change stamps of those asked for.

Runs off the event loop (blocking I/O). Every OS error is caught and kept with the entry it belongs to, so
that one unreadable entry never hides the others from the poll.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ctr_contract.repository import parse_version_dir
from serving.repository.manifest_check import Stamp, content_digest, stamp


@dataclass
class Scan:
    """What one scan found."""

    versions: dict[int, Path] = field(default_factory=dict)  # readable version folders
    stamps: dict[int, Stamp | str] = field(default_factory=dict)  # asked-for versions: stamp, or its OS error
    digests: dict[int, str] = field(default_factory=dict)  # asked-for versions: content_digest
    entry_errors: dict[int, str] = field(default_factory=dict)  # version entries that cannot even be stat'ed
    odd_names: list[str] = field(default_factory=list)  # all-digit names that are not versions: 01, 2**64
    base_error: str | None = None  # the base path itself cannot be listed


def os_error_text(exc: OSError) -> str:
    """A stable one-line description (equal for equal faults, so a repeated fault is recognised)."""
    return str(exc)  # e.g. "[Errno 40] Too many levels of symbolic links: '/models/ctr/5/loop'"


def stamp_or_error(version_dir: Path) -> Stamp | str:
    """The folder's stamp, or the text of the OS error that prevents it."""
    try:
        return stamp(version_dir)
    except OSError as exc:
        return os_error_text(exc)


def scan_base(base: Path, stamp_versions: set[int], digest_versions: frozenset[int] = frozenset()) -> Scan:
    """List `base`; stamp the versions in `stamp_versions` and hash the bytes of those in `digest_versions`.

    The stamped ones are failed versions, retried once a file changes; hashing (slower) runs less often.
    """
    scan = Scan()
    try:
        with os.scandir(base) as it:
            entries = list(it)
    except FileNotFoundError:
        return scan  # no folder yet: the same as no versions
    except NotADirectoryError:
        scan.base_error = (
            f"{base} is a file, not a folder; --model_base_path must be the folder that holds the version "
            "folders 1/, 2/, ..."
        )
        return scan
    except OSError as exc:
        scan.base_error = f"cannot list {base}: {os_error_text(exc)}"
        return scan
    for entry in entries:
        version = parse_version_dir(entry.name)
        if version is None:
            if entry.name.isascii() and entry.name.isdigit():
                scan.odd_names.append(entry.name)
            continue
        try:
            is_dir = entry.is_dir()  # follows a symlink: a looping one raises ELOOP
        except OSError as exc:
            scan.entry_errors[version] = os_error_text(exc)
            continue
        if is_dir:
            scan.versions[version] = Path(entry.path)
    for version in stamp_versions & set(scan.versions):
        files_stamp = scan.stamps[version] = stamp_or_error(scan.versions[version])
        if version in digest_versions and not isinstance(files_stamp, str):
            with contextlib.suppress(OSError):  # unreadable now: the stamp of the next scan tells
                scan.digests[version] = content_digest(scan.versions[version], files_stamp)
    return scan
