"""Columnar cache of a Criteo file: parse the text once, train from Parquet every time after.

The cache sits beside the source (`train.txt` -> `train.txt.cache.parquet`) and records the source's size
and mtime; a changed source, a new reader version, or a stricter read than the cache was built with
rebuilds it. It is written to a temporary file and renamed, so a killed build never leaves half a cache.
Under DDP one process parses (`training.data.once`: a lock file with a heartbeat); the others wait for it.
Row groups of `ROW_GROUP_ROWS` rows are the unit that streaming training reads, shuffles and shards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training.data.criteo import SCHEMA, ReadReport, read_batches
from training.data.once import build_once
from training.errors import DataError

CACHE_VERSION = 2
ROW_GROUP_ROWS = 1 << 17  # ~55 MB decoded: small enough to stream, large enough to read fast


def cache_path(data: Path) -> Path:
    return data.with_name(data.name + ".cache.parquet")


def _meta_path(data: Path) -> Path:
    return data.with_name(data.name + ".cache.json")


def _source_key(data: Path) -> dict[str, int]:
    st = data.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "version": CACHE_VERSION}


def _valid_meta(src: Path, skip_bad_rows: bool) -> dict[str, Any] | None:
    """The cache's metadata if the cache is usable for this read, else None."""
    meta_file, parquet = _meta_path(src), cache_path(src)
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
    data: str | Path, skip_bad_rows: bool = False, say: Callable[[str], None] = print
) -> tuple[Path, ReadReport]:
    """Return the Parquet cache for `data`, building it when missing or stale (once across processes).

    Returns:
        (cache path, the report of the read that built it: rows kept, bad rows skipped by kind).
    Raises:
        DataError: the source changed while it was being parsed.
    """
    src = Path(data)
    if not src.is_file():
        raise DataError(
            f"data file not found: {src} (generate one with `python -m training.synth --out {src}`)"
        )
    lock = src.with_name(src.name + ".cache.lock")
    build_once(
        lock, lambda: _valid_meta(src, skip_bad_rows) is not None, lambda: _build(src, skip_bad_rows), say
    )
    meta = _valid_meta(src, skip_bad_rows)
    if meta is None:  # only when the source changed again right after the build
        raise DataError(f"{src} changed while its cache was being built; re-run once the file is complete")
    return cache_path(src), ReadReport(**meta["report"])


def _build(src: Path, skip_bad_rows: bool) -> None:
    report = ReadReport()
    dst, meta_file = cache_path(src), _meta_path(src)
    tmp, tmp_meta = (p.with_name(f"{p.name}.{os.getpid()}.tmp") for p in (dst, meta_file))
    before = _source_key(src)
    try:
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as writer:
            pending: list[pa.RecordBatch] = []  # parser blocks, regrouped into full row groups
            for batch in read_batches(src, skip_bad_rows=skip_bad_rows, report=report):
                pending.append(batch)
                table = pa.Table.from_batches(pending)
                while len(table) >= ROW_GROUP_ROWS:
                    writer.write_table(table.slice(0, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
                    table = table.slice(ROW_GROUP_ROWS)
                pending = table.to_batches()
            if pending:
                writer.write_table(
                    pa.Table.from_batches(pending, schema=SCHEMA), row_group_size=ROW_GROUP_ROWS
                )
        if _source_key(src) != before:
            raise DataError(
                f"{src} changed while it was being parsed (size {before['size']} -> {src.stat().st_size} bytes); "
                "re-run once the file is complete"
            )
        tmp_meta.write_text(json.dumps({"source": before, "report": asdict(report)}, indent=2))
        os.replace(tmp, dst)
        os.replace(tmp_meta, meta_file)
    finally:
        tmp.unlink(missing_ok=True)
        tmp_meta.unlink(missing_ok=True)
