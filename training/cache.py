"""Columnar cache of a Criteo file: parse the text once, train from Parquet every time after.

The cache sits beside the source (`train.txt` -> `train.txt.cache.parquet`) and records the source's size
and mtime; a changed source, a new reader version, or a stricter read than the cache was built with
rebuilds it. It is written to a temporary file and renamed, so a killed build never leaves half a cache
and concurrent ranks that build it at once cannot corrupt it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training.criteo import SCHEMA, ReadReport, read_batches

CACHE_VERSION = 1


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


def ensure_cache(data: str | Path, skip_bad_rows: bool = False) -> tuple[Path, ReadReport]:
    """Return the Parquet cache for `data`, building it when missing or stale.

    Returns:
        (cache path, the report of the read that built it: rows kept, bad rows skipped by kind).
    """
    src = Path(data)
    if not src.is_file():
        raise FileNotFoundError(
            f"data file not found: {src} (generate one with `python -m training.synth --out {src}`)"
        )
    meta = _valid_meta(src, skip_bad_rows)
    if meta is not None:
        return cache_path(src), ReadReport(**meta["report"])
    report = ReadReport()
    dst, meta_file = cache_path(src), _meta_path(src)
    tmp, tmp_meta = (p.with_name(f"{p.name}.{os.getpid()}.tmp") for p in (dst, meta_file))
    try:
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as writer:
            for batch in read_batches(src, skip_bad_rows=skip_bad_rows, report=report):
                writer.write_batch(batch, row_group_size=1 << 20)
        tmp_meta.write_text(json.dumps({"source": _source_key(src), "report": asdict(report)}, indent=2))
        os.replace(tmp, dst)
        os.replace(tmp_meta, meta_file)
    finally:
        tmp.unlink(missing_ok=True)
        tmp_meta.unlink(missing_ok=True)
    return dst, report
