"""Data files on disk or in a bucket: `--data s3://BUCKET/...` listed, stamped and streamed through pyarrow.

A data file is a `Path`, or for an object the string `s3://BUCKET/KEY` (a `Path` would fold its `//`). An
`s3://` value of `--data` names one object, the objects directly under a prefix (as a folder), or a glob over
keys (`*`, `?`, `[...]` within a segment). Nothing is copied to disk first: a text object streams through the
parser into its Parquet cache in the cache folder (as a local file does), a Parquet object is read a row group
at a time by ranged GETs. An object's stamp is its size and last-modified time, a local file's is its size and
mtime: the caches record it, and a changed object is parsed again, never mixed with its old rows.

The store is the one `ctr_store.config.StoreConfig` describes (endpoint, region; credentials from the AWS
tools' variables, web identity included), as pyarrow's `S3FileSystem` (`ctr_store/arrow.py`).
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import hashlib
from pathlib import Path
from typing import Any

from ctr_features.data.compressed import ObjectFile
from ctr_store.arrow import arrow_path, classify_arrow, s3_filesystem
from ctr_store.config import StoreConfig
from ctr_store.errors import NOT_FOUND
from ctr_store.url import SCHEME, BucketPath, is_bucket_path
from training.errors import DataError

DataPath = Path | str  # a local file, or an object's s3:// URL
STREAM_BUFFER = 4 << 20  # bytes per ranged GET while a text object streams into the parser


def as_data_path(value: str | Path) -> DataPath:
    """`--data` as given: an s3:// URL stays a string, anything else is a local path."""
    return str(value) if is_bucket_path(value) else Path(value)


def is_object(path: DataPath) -> bool:
    return isinstance(path, str)


def file_name(path: DataPath) -> str:
    return path.name if isinstance(path, Path) else path.rsplit("/", 1)[-1]


def folder_key(path: DataPath) -> str:
    """Where the file sits, for the names derived from it in a shared cache folder: its resolved folder
    on disk, or the object's bucket and prefix."""
    return str(path.resolve().parent) if isinstance(path, Path) else path.rsplit("/", 1)[0]


def folder_hash(path: DataPath) -> str:
    return hashlib.sha256(folder_key(path).encode()).hexdigest()[:8]


def filesystem() -> Any:
    """This process's S3 filesystem for the store the environment names (one per store: it is thread-safe
    and holds the connections)."""
    try:
        return _filesystem(StoreConfig.from_env())
    except ValueError as e:
        raise DataError(str(e)) from e


@functools.cache
def _filesystem(config: StoreConfig) -> Any:
    return s3_filesystem(config)


class StoreDataError(DataError):
    """The store failed or refused (`reason`: ctr_store.errors' names); the message names the URL."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def store_error(exc: BaseException, what: str) -> StoreDataError:
    """A fault of the store as the one-line error `python -m training` prints; `what` names the call and URL."""
    err = classify_arrow(exc, what)
    return StoreDataError(err.reason, str(err))


def stamp(path: DataPath) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a local file or an object (its Last-Modified)."""
    if isinstance(path, Path):
        st = path.stat()
        return st.st_size, st.st_mtime_ns
    info = _info(path)
    if info.type != _file_type().File:
        raise DataError(f"no object {path}: it was removed, or is a prefix; re-run on the data that exists")
    return int(info.size), int(info.mtime_ns or 0)


def text_source(path: DataPath) -> Path | ObjectFile:
    """What the Criteo reader reads: the local file, or the object streamed `STREAM_BUFFER` bytes a GET."""
    if isinstance(path, Path):
        return path
    where = arrow_path(BucketPath.parse(path))
    return ObjectFile(
        path, lambda: filesystem().open_input_stream(where, compression=None, buffer_size=STREAM_BUFFER)
    )


def random_access(path: DataPath) -> Any:
    """What pyarrow's Parquet reader opens: the local path, or the object as a file read by ranged GETs."""
    if isinstance(path, Path):
        return path
    try:
        return filesystem().open_input_file(arrow_path(BucketPath.parse(path)))
    except OSError as e:
        raise store_error(e, f"GET {path}") from e


def list_objects(url: str) -> list[str]:
    """The objects `url` names: itself, those directly under it as a prefix, or those its glob matches.

    Raises:
        DataError: no such bucket, object or prefix, or the store refused or could not be reached.
    """
    try:
        where = BucketPath.parse(url)
    except ValueError as e:
        raise DataError(f"--data {e}") from e
    info = _info(url)
    kinds = _file_type()
    if info.type == kinds.File:
        return [url]
    if info.type == kinds.Directory:
        return [_url(i.path) for i in _listing(url, where, recursive=False) if i.type == kinds.File]
    if _info(str(BucketPath(where.bucket))).type == kinds.NotFound:
        raise DataError(f"no bucket {where.bucket!r} for --data {url}: create it, or check the name")
    if glob.has_magic(where.prefix):
        return _glob(url, where)
    raise DataError(
        f"no object or prefix {url} in bucket {where.bucket!r}: check the key (keys are case-sensitive)"
    )


def _glob(url: str, where: BucketPath) -> list[str]:
    """Objects whose keys match the pattern segment by segment (`*` never crosses a `/`, as in a shell)."""
    parts = where.prefix.split("/")
    fixed = next(i for i, p in enumerate(parts) if glob.has_magic(p))
    base = BucketPath(where.bucket, "/".join(parts[:fixed]))
    kinds = _file_type()
    found = []
    for info in _listing(url, base, recursive=len(parts) - fixed > 1):
        key = info.path.split("/", 1)[1].split("/")
        if (
            info.type == kinds.File
            and len(key) == len(parts)
            and all(fnmatch.fnmatchcase(k, p) for k, p in zip(key, parts, strict=True))
        ):
            found.append(_url(info.path))
    return found


def _listing(url: str, where: BucketPath, recursive: bool) -> list[Any]:
    from pyarrow import fs

    try:
        return list(filesystem().get_file_info(fs.FileSelector(arrow_path(where), recursive=recursive)))
    except OSError as e:
        raise store_error(e, f"LIST {url}") from e


def _info(url: str) -> Any:
    try:
        return filesystem().get_file_info(arrow_path(BucketPath.parse(url)))
    except OSError as e:
        err = store_error(e, f"HEAD {url}")
        if err.reason == NOT_FOUND:
            return _not_found(url)
        raise err from e


def _not_found(url: str) -> Any:
    from pyarrow import fs

    return fs.FileInfo(arrow_path(BucketPath.parse(url)), fs.FileType.NotFound)


def _file_type() -> Any:
    from pyarrow import fs

    return fs.FileType


def _url(arrow: str) -> str:
    return SCHEME + arrow
