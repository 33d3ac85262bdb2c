"""Columnar cache of a Criteo file: parse the text once, train from Parquet every time after.

The cache sits in the cache folder (`training/data/cache_dir.py`: beside the source when it is writable,
`train.txt` -> `train.txt.cache.parquet`; an object's in `--cache-dir` or the user's cache folder) and records
the source's size and mtime (an object's Last-Modified: `training/data/objects.py`); a changed source, a new
reader version, or a stricter read than the cache was built with rebuilds it. It is written to a temporary
file and renamed, so a killed build never leaves half a cache. Processes that need the same cache build it
once (`training/data/once.py`: a lock file with a heartbeat); the others wait for it.
Row groups of `ROW_GROUP_ROWS` rows are the unit that streaming training reads, shuffles and shards.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctr_features.data.criteo import SCHEMA, ReadReport, read_batches
from training.data.cache_dir import cached_name, user_cache_dir
from training.data.objects import DataPath, as_data_path, is_object, stamp, store_error, text_source
from training.data.once import build_once
from training.errors import DataError

CACHE_VERSION = 2
ROW_GROUP_ROWS = 1 << 17  # ~55 MB decoded: small enough to stream, large enough to read fast


def cache_path(data: DataPath, cache_dir: Path | None = None) -> Path:
    """`FILE.cache.parquet` beside the data, or its name in `cache_dir` (see `training/data/cache_dir.py`)."""
    if cache_dir is not None:
        folder = cache_dir
    else:
        folder = data.parent if isinstance(data, Path) else user_cache_dir()
    return folder / (cached_name(data, folder) + ".cache.parquet")


def _meta_path(data: DataPath, cache_dir: Path | None) -> Path:
    return cache_path(data, cache_dir).with_suffix(".json")


def _source_key(data: DataPath) -> dict[str, int]:
    size, mtime_ns = stamp(data)
    return {"size": size, "mtime_ns": mtime_ns, "version": CACHE_VERSION}


def _valid_meta(src: DataPath, skip_bad_rows: bool, cache_dir: Path | None) -> dict[str, Any] | None:
    """The cache's metadata if the cache is usable for this read, else None."""
    meta_file, parquet = _meta_path(src, cache_dir), cache_path(src, cache_dir)
    if not (meta_file.is_file() and parquet.is_file()):
        return None
    try:
        meta = json.loads(meta_file.read_text())
        rows = pq.ParquetFile(parquet).metadata.num_rows
        fresh = meta["source"] == _source_key(src) and rows == meta["report"]["rows"]
        skipped = bool(meta["report"]["skipped"])
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid) as e:
        # KeyError/TypeError: metadata JSON of another shape (hand-edited, truncated by a full disk).
        print(f"warning: rebuilding unreadable cache {parquet}: {e!r}")
        return None
    # A cache built by skipping bad rows must not satisfy a strict read: that read has to fail.
    return meta if fresh and (skip_bad_rows or not skipped) else None


def ensure_cache(
    data: str | Path,
    skip_bad_rows: bool = False,
    say: Callable[[str], None] = print,
    cache_dir: Path | None = None,
) -> tuple[Path, ReadReport]:
    """Return the Parquet cache for `data`, building it when missing or stale (once across processes).

    Returns:
        (cache path, the report of the read that built it: rows kept, bad rows skipped by kind).
    Raises:
        DataError: the source changed while it was being parsed.
    """
    src = as_data_path(data)
    if isinstance(src, Path) and not src.is_file():
        raise DataError(
            f"data file not found: {src} (generate one with `python -m training.synth --out {src}`)"
        )
    lock = cache_path(src, cache_dir).with_suffix(".lock")
    build_once(
        lock,
        lambda: _valid_meta(src, skip_bad_rows, cache_dir) is not None,
        lambda: _build(src, skip_bad_rows, cache_dir),
        say,
    )
    meta = _valid_meta(src, skip_bad_rows, cache_dir)
    if meta is None:  # only when the source changed again right after the build
        raise DataError(f"{src} changed while its cache was being built; re-run once the file is complete")
    return cache_path(src, cache_dir), ReadReport(**meta["report"])


def _build(src: DataPath, skip_bad_rows: bool, cache_dir: Path | None) -> None:
    report = ReadReport()
    dst, meta_file = cache_path(src, cache_dir), _meta_path(src, cache_dir)
    tmp, tmp_meta = (p.with_name(f"{p.name}.{os.getpid()}.tmp") for p in (dst, meta_file))
    before = _source_key(src)
    try:
        # Row groups are written on a second thread while the next block parses (both release the GIL);
        # one waits at most, so memory stays a couple of row groups.
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as writer, ThreadPoolExecutor(1) as bg:
            waiting: deque[Future[None]] = deque()

            def write(table: pa.Table) -> None:
                waiting.append(bg.submit(writer.write_table, table, row_group_size=ROW_GROUP_ROWS))
                if len(waiting) > 1:
                    waiting.popleft().result()

            pending: list[pa.RecordBatch] = []  # parser blocks, regrouped into full row groups
            for batch in read_batches(text_source(src), skip_bad_rows=skip_bad_rows, report=report):
                pending.append(batch)
                table = pa.Table.from_batches(pending)
                while len(table) >= ROW_GROUP_ROWS:
                    write(table.slice(0, ROW_GROUP_ROWS))
                    table = table.slice(ROW_GROUP_ROWS)
                pending = table.to_batches()
            if pending:
                write(pa.Table.from_batches(pending, schema=SCHEMA))
            while waiting:
                waiting.popleft().result()
        if (after := _source_key(src)) != before:
            raise DataError(
                f"{src} changed while it was being parsed (size {before['size']} -> {after['size']} bytes); "
                "re-run once the file is complete"
            )
        tmp_meta.write_text(json.dumps({"source": before, "report": asdict(report)}, indent=2))
        os.replace(tmp, dst)
        os.replace(tmp_meta, meta_file)
    except OSError as e:
        if is_object(src) and (err := store_error(e, f"GET {src}")).reason != "error":
            raise err from e  # the store failed mid-read: one line, with the URL
        raise
    finally:
        tmp.unlink(missing_ok=True)
        tmp_meta.unlink(missing_ok=True)
