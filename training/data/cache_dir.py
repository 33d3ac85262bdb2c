"""Where a run keeps what it derives from the data (Parquet caches, fitted spec, encoded records, locks).

`--cache-dir DIR` when given; otherwise beside the data when that folder is writable, else the user's cache
folder (`$XDG_CACHE_HOME/ctr-pipeline`, or `~/.cache/ctr-pipeline`), so data on a read-only mount (the
Kubernetes job's `/data`) still trains; data in a bucket has no folder beside it, so its caches go to
`--cache-dir` or the user's cache folder. Files derived from data in another folder (or in a bucket) carry a
short hash of that folder (or bucket and prefix) in their name, so one cache folder serves any number of data
folders without collisions.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from training.data.objects import DataPath, file_name, folder_hash, folder_key
from training.errors import DataError

APP = "ctr-pipeline"


def _writable(folder: Path) -> bool:
    """Whether a file can be created in `folder` (tried, not guessed: root ignores permission bits, ro mounts do not)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def user_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ctr-pipeline`, or `~/.cache/ctr-pipeline`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / APP


def choose_cache_dir(data_folder: Path | None, requested: Path | None) -> Path:
    """The cache folder for data in `data_folder` (None: in a bucket): `requested`, else beside the data,
    else the user's cache.

    Raises:
        DataError: the requested folder (or, without one, every default) cannot be written.
    """
    if requested is not None:
        try:
            requested.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(
                f"--cache-dir {requested} cannot be created ({e.strerror}); pass a writable folder"
            ) from e
        if not _writable(requested):
            raise DataError(f"--cache-dir {requested} is not writable; pass a writable folder")
        return requested
    if data_folder is not None and _writable(data_folder):
        return data_folder
    fallback = user_cache_dir()
    try:
        fallback.mkdir(parents=True, exist_ok=True)
        if _writable(fallback):
            return fallback
    except OSError:
        pass  # reported below, with the flag that fixes it
    where = f"the data folder {data_folder} is read-only" if data_folder else "the data is in a bucket"
    raise DataError(
        f"{where} and the user cache folder {fallback} cannot be written; pass --cache-dir DIR with a writable folder"
    )


def cached_name(source: DataPath, cache_dir: Path) -> str:
    """The name files derived from `source` take in `cache_dir`: its own name beside it, else name + the hash
    of its folder (an object's: its bucket and prefix)."""
    if isinstance(source, Path) and folder_key(source) == str(cache_dir.resolve()):
        return source.name
    return f"{file_name(source)}.{folder_hash(source)}"
