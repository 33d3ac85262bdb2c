"""What `--data` names: one Criteo file, a directory of them, or a glob; text (TSV/CSV) or Parquet; on disk
or in a bucket (`s3://BUCKET/KEY`, a prefix or a glob of keys: `training/data/objects.py`).

Several files are read as one data set, in sorted path order (daily partitions `day_0`, `day_1`, ... sort
naturally). Files this project derives beside the data (caches, oracle files, temporaries) are never inputs.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path

from ctr_features.data.compressed import text_name
from training.data.objects import DataPath, as_data_path, file_name, list_objects
from training.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")
TEXT_SUFFIXES = ("", ".txt", ".tsv", ".csv")
_DERIVED = re.compile(r"\.(cache\.parquet|cache\.json|oracle\.npy|oracle\.json|lock|tmp)$|\.tmp\.|^\.")


@dataclass(frozen=True)
class DataFile:
    path: DataPath
    parquet: bool


def _is_input_name(name: str) -> bool:
    plain = text_name(Path(name))  # `day_0.gz` is text; compressed Parquet is not a thing
    suffix = Path(plain).suffix.lower()
    kinds = TEXT_SUFFIXES if plain != name else (*PARQUET_SUFFIXES, *TEXT_SUFFIXES)
    return not _DERIVED.search(name) and suffix in kinds


def _is_input(path: Path) -> bool:
    return path.is_file() and _is_input_name(path.name)


def _natural_key(path: DataPath) -> list[object]:
    """`day_2` before `day_10`: digit runs compare as numbers."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def resolve_data(data: str | Path) -> list[DataFile]:
    """The input files `data` names, in reading order.

    Raises:
        DataError: nothing matches, or text and Parquet files are mixed.
    """
    text = str(data)
    files: list[DataPath]
    p = as_data_path(text)
    if isinstance(p, str):
        named: list[DataPath] = list(list_objects(p))
        files = named if named == [p] else [f for f in named if _is_input_name(file_name(f))]
        if not files and glob.has_magic(text):
            raise DataError(f"no data files match {text!r}")
        if not files:
            raise DataError(
                f"{p} holds no data files: expected Criteo text objects (no suffix, .txt, .tsv, .csv; or .gz, .zst, "
                ".bz2) or Parquet objects (.parquet)"
            )
    elif p.is_file():
        files = [p]
    elif p.is_dir():
        files = [f for f in p.iterdir() if _is_input(f)]
        if not files:
            raise DataError(
                f"{p} holds no data files: expected Criteo text files (no suffix, .txt, .tsv, .csv; or .gz, .zst, .bz2) "
                f"or Parquet files (.parquet); generate one with `python -m training.synth --out {p / 'train.txt'}`"
            )
    elif glob.has_magic(text):
        files = [Path(f) for f in glob.glob(text) if _is_input(Path(f))]
        if not files:
            raise DataError(f"no data files match {text!r}")
    else:
        raise DataError(f"data file not found: {p} (generate one with `python -m training.synth --out {p}`)")
    files.sort(key=_natural_key)
    kinds = {_is_parquet(f) for f in files}
    if len(kinds) > 1:
        raise DataError(
            f"{data} mixes text and Parquet files ({', '.join(file_name(f) for f in files[:4])}, ...): "
            "point --data at one kind"
        )
    return [DataFile(f, _is_parquet(f)) for f in files]


def _is_parquet(path: DataPath) -> bool:
    return Path(file_name(path)).suffix.lower() in PARQUET_SUFFIXES
