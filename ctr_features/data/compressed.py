"""Compressed Criteo text (gzip, zstd, bz2), streamed: decompressed block by block, never to disk.

The codec is taken from the file's first bytes (magic numbers), so `day_0.gz`, `train.txt.zst` and a
gzip file without its suffix all read the same way; the suffix only decides what `--data DIR` lists.
A file that is not on the local disk (an object in a bucket) is an `ObjectFile`: its name, and how to open a
fresh stream of its bytes, which the reader calls once per pass over the file.
"""

from __future__ import annotations

import bz2
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

# Suffixes of compressed text files (`day_0.gz`, `train.txt.zst`), and the codec each file's magic names.
COMPRESSED_SUFFIXES = (".gz", ".gzip", ".zst", ".zstd", ".bz2")
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bz2"))


@dataclass(frozen=True)
class ObjectFile:
    """A file read through another filesystem: `url` names it in messages, `open` streams its raw bytes."""

    url: str
    open: Callable[[], pa.NativeFile]

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return self.url


def open_raw(path: Path | ObjectFile) -> BinaryIO | pa.NativeFile:
    """A fresh stream of the file's bytes as stored (compressed or not)."""
    return path.open() if isinstance(path, ObjectFile) else path.open("rb")


def codec(path: Path | ObjectFile) -> str | None:
    """The compression of `path` by its magic bytes ("gzip", "zstd", "bz2"), or None for plain text."""
    with open_raw(path) as f:
        head = f.read(4)
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


def open_text(path: Path | ObjectFile) -> pa.NativeFile:
    """A stream of the file's text, decompressed on the fly when the file is compressed."""
    name = codec(path)
    if isinstance(path, ObjectFile):
        return pa.input_stream(path.open(), compression=name)
    return pa.input_stream(str(path), compression=name)


def text_name(path: Path | ObjectFile) -> str:
    """The file name without its compression suffix (`train.txt.gz` -> `train.txt`, `day_0.gz` -> `day_0`)."""
    name = path.name
    for suffix in COMPRESSED_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _decompressor(name: str | None) -> Callable[[bytes], bytes] | None:
    """An incremental decompressor that returns every byte it can before an error (stdlib codecs)."""
    if name == "gzip":
        return zlib.decompressobj(wbits=47).decompress  # 47: gzip or zlib header, read from the data
    if name == "bz2":
        return bz2.BZ2Decompressor().decompress
    return None


def truncated_message(path: Path | ObjectFile, cause: BaseException) -> str:
    """The error for compressed data that ends early or is corrupt: the file, and the last whole row in it."""
    complete = 0  # newline-terminated rows that decompress before the failure
    step = _decompressor(codec(path))
    try:
        if step is None:  # zstd: Arrow's stream, read in small steps (it can hold back a few rows)
            with open_text(path) as f:
                while block := f.read(1 << 12):
                    complete += block.count(b"\n")
        else:
            with open_raw(path) as raw:
                while block := raw.read(1 << 16):
                    complete += step(block).count(b"\n")
    except (OSError, EOFError, zlib.error):
        pass  # the same failure, reached again: `complete` now counts every row before it
    return (
        f"{path}: compressed data breaks off after row {complete} ({cause}); "
        "the file is truncated or corrupt: download or compress it again"
    )
