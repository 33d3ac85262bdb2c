"""Data preparation: `--data` -> Parquet caches -> fitted FeatureSpec -> encoded records, shared by the ranks.

Three steps, each timed (rows/s), each split among the preparing ranks (`training.data.rank_group`):
  parse   text files -> Parquet caches (`training.data.cache`); file i is parsed by rank i % world.
  fit     rank r counts the categorical values of its own contiguous share of the row groups
          (`training.data.category_counts`); rank 0 gathers and merges the counts. The numeric means and
          deviations are sums in row order (their bits depend on it), so rank 0 alone reads the 13 numeric
          columns of every training row, in order, while the others count: the spec is the 1-process spec.
  encode  rank r writes the records of its row groups at their split index (`ctr_features.compiled.records`).
The results are those the one-process reference (tests/training/reference_prepare.py) makes (same key, names
and contents), in the cache folder (`training.data.cache_dir`), and a later run reuses them. Temporaries are
renamed into place only after every rank has finished, and the JSON that marks the result complete comes last.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.compiled.records import RECORD, encode_records, lookups, numeric_matrix
from ctr_features.data.criteo import ReadReport
from ctr_features.fit import (
    MAX_ENTRIES,
    MIN_COUNT,
    SMOOTHING,
    VOCAB_MIN_COUNT,
    VOCAB_SIZE,
    assemble_spec,
    carry_sum,
)
from ctr_features.layout import N_NUM, signed_log1p
from ctr_features.spec import FeatureSpec
from training.data.cache import cache_path, ensure_cache
from training.data.cache_dir import cached_name, choose_cache_dir
from training.data.category_counts import MAX_VALUES, FieldCounts
from training.data.feature_cache import write_at
from training.data.objects import DataPath, stamp
from training.data.once import build_once
from training.data.parquet import ParquetData, Piece, Split
from training.data.rank_group import RankGroup
from training.data.sources import resolve_data
from training.errors import DataError

PREPARED_VERSION = 1  # part of every result's key: a change of what is prepared bumps it
_ENCODE_ROWS = 1 << 15
_THREADS = min(4, os.cpu_count() or 1)  # row groups encoded at once: Arrow and numpy release the GIL


@dataclass
class Prepared:
    """What training reads: the data set, its spec, each split's encoded records, and the parse report."""

    data: ParquetData
    spec: FeatureSpec
    encoded: dict[Split, Path]
    report: ReadReport
    cache_dir: Path
    timings: dict[str, tuple[int, float]] = field(default_factory=dict)  # step -> (rows, seconds)


def _my_pieces(pieces: list[Piece], group: RankGroup) -> list[Piece]:
    """This rank's contiguous share of the row groups, balanced by rows."""
    if group.world == 1:
        return pieces
    ends = np.cumsum([p.rows for p in pieces])
    owner = (
        np.minimum((ends - 1) * group.world // max(int(ends[-1]), 1), group.world - 1) if ends.size else ends
    )
    return [p for p, o in zip(pieces, owner, strict=True) if o == group.rank]


def _numeric_moments(data: ParquetData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, mean and summed squared deviations of signed_log1p(I1..I13) over the training rows, in row order."""
    count, total, sq = np.zeros(N_NUM, np.int64), np.zeros(N_NUM), np.zeros(N_NUM)
    train = [p for p in data.pieces if p.train_rows]
    for p in train:
        v = signed_log1p(numeric_matrix(data.read(p, "train", NUMERIC_FIELDS).table))
        present = np.isfinite(v)
        count += present.sum(axis=0)
        total = carry_sum(total, np.where(present, v, 0.0))
    mean = np.divide(total, count, out=np.zeros(N_NUM), where=count > 0)
    for p in train:
        v = signed_log1p(numeric_matrix(data.read(p, "train", NUMERIC_FIELDS).table))
        sq = carry_sum(sq, np.where(np.isfinite(v), (v - mean) ** 2, 0.0))
    return count, mean, sq


def _fit(
    data: ParquetData, mine: list[Piece], width: int, group: RankGroup, say: Callable[[str], None]
) -> FeatureSpec:
    """The spec `FeatureSpec.fit_streaming` fits on the training rows, from every rank's counts (see module docstring)."""
    counts = [FieldCounts() for _ in CATEGORICAL_FIELDS]
    rows, clicks = 0, 0.0
    background = ThreadPoolExecutor(1)  # rank 0's numeric pass runs beside its counting
    numeric = background.submit(_numeric_moments, _copy(data)) if group.rank == 0 else None
    for piece in mine:
        if piece.train_rows:
            table = data.read_splits(piece, ("train",), (LABEL, *CATEGORICAL_FIELDS), dictionary=True)[
                "train"
            ].table
            y = table.column(LABEL).to_numpy().astype(np.float64)
            rows, clicks = rows + len(y), clicks + float(y.sum())  # 0/1 labels: exact integer sums
            for j, name in enumerate(CATEGORICAL_FIELDS):
                counts[j].add(table.column(name), y)
    moments = numeric.result() if numeric is not None else None
    background.shutdown()
    gathered = group.gather((rows, clicks, [c.table() for c in counts], [c.error for c in counts]))
    spec_dict = None
    if gathered is not None and moments is not None:
        total_rows = sum(g[0] for g in gathered)
        total_clicks = float(sum(g[1] for g in gathered))
        merged = [FieldCounts() for _ in CATEGORICAL_FIELDS]
        for j, m in enumerate(merged):
            for g in gathered:
                m.add_table(g[2][j])
            m.error = sum(g[3][j] for g in gathered)
            m.table()  # the last merge, which may apply the cap
            if m.error:
                say(
                    f"warning: {CATEGORICAL_FIELDS[j]} has more than {MAX_VALUES} distinct values: the counts of "
                    f"its rarest values may fall short by up to {m.error} views (frequent ones are exact)"
                )
        keep = min(VOCAB_MIN_COUNT, MIN_COUNT)
        spec = FeatureSpec(
            **assemble_spec(
                total_rows,
                total_clicks,
                *moments,
                lambda j: merged[j].counts(keep),
                width,
                MIN_COUNT,
                SMOOTHING,
                MAX_ENTRIES,
                VOCAB_SIZE,
                VOCAB_MIN_COUNT,
            )
        )
        if group.world == 1:
            return spec
        spec_dict = spec.to_dict()
    return FeatureSpec.from_dict(group.broadcast(spec_dict))


def _copy(data: ParquetData) -> ParquetData:
    """The same data set with its own open files, for another thread."""
    return ParquetData.from_json(data.to_json())


def _encode(data: ParquetData, mine: list[Piece], spec: FeatureSpec, tmp: dict[Split, Path]) -> None:
    """Write this rank's records into the preallocated temporaries, a few row groups at once (threads)."""
    fields = lookups(spec)
    fds = {s: os.open(p, os.O_WRONLY) for s, p in tmp.items()}
    workers = max(1, min(_THREADS, len(mine)))

    def run(k: int) -> None:
        own = _copy(data)
        for piece in mine[k::workers]:
            splits: tuple[Split, ...] = tuple(s for s in ("train", "val") if piece.count(s))  # type: ignore[misc]
            for split, chunk in own.read_splits(piece, splits, dictionary=True).items():
                for a in range(0, len(chunk.ids), _ENCODE_ROWS):
                    part = chunk.table.slice(a, _ENCODE_ROWS)
                    rec = encode_records(spec, fields, part, chunk.index[a : a + len(part)])
                    write_at(fds[split], rec, piece.start(split) + a)

    try:
        with ThreadPoolExecutor(workers) as pool:
            for done in [pool.submit(run, k) for k in range(workers)]:
                done.result()
    finally:
        for fd in fds.values():
            os.close(fd)


def _parse(
    files: list[DataPath], skip_bad_rows: bool, cache_dir: Path, group: RankGroup, say: Callable[[str], None]
) -> tuple[list[Path], ReadReport, list[int]]:
    """Parquet caches of the text files (this rank parses its share), the merged parse report, and each
    file's rows."""
    error = None
    try:
        for i, f in enumerate(files):
            if i % group.world == group.rank:
                ensure_cache(f, skip_bad_rows, say, cache_dir)
    except (DataError, ValueError, OSError) as e:
        error = e
    group.raise_any(error)
    report, caches, rows = ReadReport(), [], []
    for f in files:  # every cache is built by now: this only reads their metadata
        cache, r = ensure_cache(f, skip_bad_rows, say, cache_dir)
        caches.append(cache)
        rows.append(r.rows)
        report.rows += r.rows
        for kind, k in r.skipped.items():
            report.skipped[kind] = report.skipped.get(kind, 0) + k
        report.examples.extend(r.examples[: max(0, 5 - len(report.examples))])
    return caches, report, rows


def _targets(
    parquet: list[DataPath],
    cache_dir: Path,
    val_fraction: float,
    width: int,
    max_rows: int | None,
    frozen: FeatureSpec | None,
) -> tuple[Path, dict[Split, Path]]:
    """The result's JSON and record files: the reference `prepare_streaming`'s key and names, in the cache folder."""
    key_src = json.dumps(
        [
            PREPARED_VERSION,
            val_fraction,
            width,
            max_rows,
            frozen.to_dict() if frozen else None,
            [(str(f.resolve()) if isinstance(f, Path) else f, *stamp(f)) for f in parquet],
        ]
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    stem = cache_dir / f"{cached_name(parquet[0], cache_dir)}.prepared-{key}"
    return stem.with_name(stem.name + ".json"), {
        s: stem.with_name(f"{stem.name}.{s}.bin") for s in ("train", "val")
    }


def _build(
    parquet: list[DataPath],
    target: Path,
    encoded: dict[Split, Path],
    val_fraction: float,
    width: int,
    max_rows: int | None,
    frozen: FeatureSpec | None,
    group: RankGroup,
    timings: dict[str, tuple[int, float]],
    say: Callable[[str], None],
) -> None:
    """Fit and encode with every rank; rank 0 renames the results into place once all are written."""
    data = ParquetData.open(parquet, val_fraction, max_rows)
    train, val = data.rows("train"), data.rows("val")
    if train == 0 or val == 0:
        where = parquet[0] if len(parquet) == 1 else f"{len(parquet)} files"
        raise DataError(
            f"{where}: {train + val} rows give {train} training and {val} validation rows; need both"
        )
    mine = _my_pieces(data.pieces, group)
    t = time.perf_counter()
    spec = frozen if frozen is not None else _fit(data, mine, width, group, say)
    timings["fit"] = (train, time.perf_counter() - t)
    t = time.perf_counter()
    token = group.broadcast(uuid.uuid4().hex[:12])
    tmp = {s: p.with_name(f"{p.name}.{token}.tmp") for s, p in encoded.items()}
    error: BaseException | None = None
    try:
        if group.rank == 0:
            for s, p in tmp.items():
                with p.open("wb") as f:
                    f.truncate(data.rows(s) * RECORD.itemsize)
        group.barrier()
        if not all(p.is_file() for p in tmp.values()):
            error = DataError(
                f"rank {group.rank} cannot see {tmp['train']} that rank 0 wrote: every rank needs the same "
                "--cache-dir, on storage they all mount"
            )
        else:
            _encode(data, mine, spec, tmp)
        group.raise_any(error)
        if group.rank == 0:
            for s, p in tmp.items():
                os.replace(p, encoded[s])
            json_tmp = target.with_name(
                f"{target.name}.{token}.tmp"
            )  # written last: it marks the result ready
            json_tmp.write_text(
                json.dumps({"data": data.to_json(), "spec": spec.to_dict()}, separators=(",", ":"))
            )
            os.replace(json_tmp, target)
        group.barrier()
    finally:
        if group.rank == 0:
            for p in tmp.values():
                p.unlink(missing_ok=True)
    timings["encode"] = (train + val, time.perf_counter() - t)


def prepare_data(
    data: str | Path,
    cache_dir: Path | None,
    val_fraction: float,
    width: int,
    max_rows: int | None,
    skip_bad_rows: bool,
    say: Callable[[str], None],
    frozen: FeatureSpec | None = None,
    group: RankGroup | None = None,
) -> Prepared:
    """Parse, fit and encode `data` once (reused when done before); see the module docstring.

    Args:
        data: `--data`: a file, folder or glob of Criteo text (plain or compressed) or Parquet files.
        cache_dir: `--cache-dir`, or None for the default (`training.data.cache_dir.choose_cache_dir`).
        frozen: a spec to encode with (warm start) instead of fitting one.
        group: the ranks preparing together; one process when None.
    Raises:
        DataError: bad input, no writable cache folder, or data that changed while it was prepared.
    """
    group = group or RankGroup()
    files = resolve_data(data)
    first = files[0].path
    cache = choose_cache_dir(first.parent if isinstance(first, Path) else None, cache_dir)
    say(f"cache folder: {cache}")
    timings: dict[str, tuple[int, float]] = {}
    t = time.perf_counter()
    if files[0].parquet:
        parquet: list[DataPath] = [f.path for f in files]
        report = ReadReport()
    else:
        before = [_mtime(cache_path(f.path, cache)) for f in files]
        caches, report, file_rows = _parse([f.path for f in files], skip_bad_rows, cache, group, say)
        parquet = list(caches)
        # Only the files whose cache this run (re)built were parsed; reused caches cost no parsing.
        parsed = [n for p, old, n in zip(caches, before, file_rows, strict=True) if _mtime(p) != old]
        if parsed:
            timings["parse"] = (sum(parsed), time.perf_counter() - t)
    target, encoded = _targets(parquet, cache, val_fraction, width, max_rows, frozen)

    def ready() -> bool:
        return target.is_file() and all(p.is_file() for p in encoded.values())

    if group.world == 1:
        lock = target.with_name(target.name.removesuffix(".json") + ".lock")
        build_once(
            lock,
            ready,
            lambda: _build(
                parquet, target, encoded, val_fraction, width, max_rows, frozen, group, timings, say
            ),
            say,
        )
    elif not group.broadcast(ready()):
        error: BaseException | None = None
        try:
            _build(parquet, target, encoded, val_fraction, width, max_rows, frozen, group, timings, say)
        except (DataError, ValueError, OSError) as e:
            error = e
        group.raise_any(error)
    d = json.loads(target.read_text())
    prepared = ParquetData.from_json(d["data"])
    if [tuple(s) for s in prepared.stamps] != [stamp(f) for f in parquet]:
        raise DataError(
            f"the data changed while it was being prepared ({parquet[0]} ...); re-run once it is complete"
        )
    if files[0].parquet:
        report.rows = prepared.rows("train") + prepared.rows("val")
    spec = frozen if frozen is not None else FeatureSpec.from_dict(d["spec"])
    for step, (rows, seconds) in timings.items():
        say(f"{step}: {rows} rows in {seconds:.2f}s ({rows / max(seconds, 1e-9):,.0f} rows/s)")
    return Prepared(prepared, spec, encoded, report, cache, timings)


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.is_file() else None
