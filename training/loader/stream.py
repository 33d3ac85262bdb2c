"""The stream loader (`--loader stream`): whole batches of the encoded records through a shuffle buffer, each
rank its own rows, whatever the row count.

Per epoch, the row groups are put in a seeded order (a permutation when shuffling) and that order's rows
of the split are cut into `world` contiguous ranges that differ by at most one row; rank r reads only the
row groups its range touches (two ranks share a boundary group, each keeping its own rows), so there are
never idle ranks, even with more ranks than row groups. Each rank fills a buffer of `buffer_rows`
transformed rows, hands out whole batches of randomly drawn rows until half of it is left, then refills,
so rows mix across row groups; while it first fills, it already hands out half of each slice's rows (so the
first step does not wait for a whole buffer). Every rank makes ceil(ceil(N / world) / batch) batches (DDP needs equal step
counts): across ranks each row is seen exactly once per epoch. The order depends only on (seed, epoch,
rank), so a resumed run replays it. With negative sampling (`training.loader.negatives`) the same holds for
the kept training rows: the plan counts them, and a slice holds only its kept records.

Encoded splits (the usual case) are mapped: the buffer holds row ids, the kernel reads slices ahead, and a
batch gathers and expands its records as it is drawn; a slice's pages leave the process once its last row
is drawn. Data that could not be encoded once is read and transformed by a background thread instead.
Memory per process: the buffer (buffer_rows + 32k ids, or feature rows on the transforming path), the
mapped pages of the slices that still have rows in it (~32 slices of 8.9 MB at the default sizes), one
batch expanded at a time, whatever the row count.
"""

from __future__ import annotations

import contextlib
import mmap
import queue
import threading
from collections.abc import Generator, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset

from ctr_contract.schema import LABEL
from ctr_features.compiled.records import RECORD, expand, transform_chunk
from ctr_features.spec import FeatureSpec
from training.data.parquet import ParquetData, Piece, Split
from training.errors import DataError
from training.loader.memory import Batch, shard_bounds
from training.loader.negatives import KeptRows

DEFAULT_BUFFER_ROWS = 1 << 17  # one cache row group's rows; on the mapped path 16 bytes a row (two int64 ids)
_PREFETCH = 2  # transformed slices waiting in the queue (one more is being transformed)
_READAHEAD = 2  # encoded slices the kernel is asked to read ahead
_MOVE_ROWS = 1 << 12  # rows per chunk when the buffer fills its holes
_TRANSFORM_ROWS = 1 << 15
_FIRST_SLICE_ROWS = 1 << 12  # two batches of 2048: the ramp-up hands out one while the next slices load
_WORDS = RECORD.itemsize // 8  # a record is 34 int64 words


def epoch_plan(
    pieces: list[Piece], piece_rows: np.ndarray, order: np.ndarray, rank: int, world: int
) -> list[tuple[Piece, int, int]]:
    """(piece, lo, hi): the slices of each piece's rows (`piece_rows[i]` of piece i) that `rank` reads, in `order`.

    With negative sampling, lo and hi count the piece's kept rows, not its split rows.
    """
    counts = piece_rows[order].astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(counts)])
    total = int(cum[-1])
    lo, hi = rank * total // world, (rank + 1) * total // world
    plan = []
    for k, i in enumerate(order.tolist()):
        a, b = max(lo - int(cum[k]), 0), min(hi - int(cum[k]), int(counts[k]))
        if a < b:
            plan.append((pieces[i], a, b))
    return plan


class StreamedBatches(IterableDataset):
    """Yields (x, y, index) batches of this rank's rows of one split; see the module docstring."""

    def __init__(
        self,
        data: ParquetData,
        spec: FeatureSpec,
        split: Split,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        buffer_rows: int = DEFAULT_BUFFER_ROWS,
        encoded: Path | None = None,
        kept: KeptRows | None = None,
    ) -> None:
        super().__init__()
        if kept is not None and split != "train":
            raise ValueError(f"negative sampling applies to the training split only, not {split!r}")
        n = kept.rows if kept is not None else data.rows(split)
        if n < world_size:
            raise ValueError(
                f"{n} {split} rows cannot be shared by {world_size} ranks; use fewer --devices or more data"
            )
        self.data, self.spec, self.split = data, spec, split
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size, self.buffer_rows = rank, world_size, max(buffer_rows, batch_size)
        self.rows, self.encoded, self.kept = n, encoded, kept
        counts = [p.count(split) for p in data.pieces] if kept is None else kept.piece_counts
        self.piece_rows = np.asarray(counts, dtype=np.int64)  # rows of each piece this loader visits
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        largest = -(-self.rows // self.world_size)
        return -(-largest // self.batch_size)

    def plan(self) -> list[tuple[Piece, int, int]]:
        """This rank's row-group slices for this epoch, in reading order."""
        order = np.arange(len(self.data.pieces))
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(order)
        return epoch_plan(self.data.pieces, self.piece_rows, order, self.rank, self.world_size)

    def _chunks(self, plan: list[tuple[Piece, int, int]]) -> Iterator[Batch]:
        """The transforming path's slices; runs on the prefetch thread (see `__iter__`)."""
        first = [True]  # the epoch's first slice is small, so its first batch comes after a few thousand rows
        for piece, lo, hi in plan:
            chunk = self.data.read(piece, self.split)
            offsets = self.kept.offsets(piece) if self.kept is not None else None
            for a, n in _slices(lo, hi, first):  # slices bound the transform's temporaries
                if offsets is None:
                    table, index = chunk.table.slice(a, n), chunk.index[a : a + n]
                else:  # the slice's kept rows (lo, hi count kept rows)
                    rows = offsets[a : a + n]
                    table, index = chunk.table.take(pa.array(rows)), chunk.index[rows]
                x = torch.from_numpy(transform_chunk(self.spec, table))
                y = torch.from_numpy(table.column(LABEL).to_numpy().astype(np.float32)).reshape(-1, 1)
                yield x, y, torch.from_numpy(index)

    def _batches(
        self, buf: _Buffer, added: Iterator[int], sizes: list[int], fill: int, g: torch.Generator
    ) -> Generator[Batch, None, int]:
        """Drain `buf` as slices are `added`; returns the number of batches yielded."""
        k = 0
        for rows in added:
            if buf.n >= fill:
                # Keep half a buffer back so that rows of the next row groups mix with these.
                k = yield from buf.drain(
                    sizes, k, self.buffer_rows // 2 if self.shuffle else 0, g if self.shuffle else None
                )
            elif self.shuffle:
                # Ramp-up: while the buffer first fills, hand out half of each new slice's rows (drawn from all
                # rows held), so training starts after one slice instead of a whole buffer and the buffer still
                # grows by half a slice per slice.
                k = yield from buf.drain(sizes, k, buf.n - rows // 2, g)
        return (yield from buf.drain(sizes, k, 0, g if self.shuffle else None))

    def _slices_of(self, plan: list[tuple[Piece, int, int]]) -> list[tuple[int, int]]:
        """(first record, records spanned) of each slice of the encoded split this rank reads this epoch, in order.

        With negative sampling a slice's span runs from its first kept record to its last; the buffer then
        holds only the kept records in it (`_MappedBuffer.add_next`).
        """
        first, out = [True], []
        for piece, lo, hi in plan:
            start = piece.start(self.split)
            offsets = self.kept.offsets(piece) if self.kept is not None else None
            for a, n in _slices(lo, hi, first):
                if offsets is None:
                    out.append((start + a, n))
                else:
                    out.append((start + int(offsets[a]), int(offsets[a + n - 1] - offsets[a]) + 1))
        return out

    @staticmethod
    def _mapped(buf: _MappedBuffer) -> Iterator[int]:
        """The encoded path: each slice's rows added to `buf`, the kernel reading `_READAHEAD` slices ahead."""
        for i in range(min(_READAHEAD, len(buf.slices))):
            buf.will_need(i)
        for i in range(len(buf.slices)):
            if i + _READAHEAD < len(buf.slices):
                buf.will_need(i + _READAHEAD)
            yield buf.add_next()

    def __iter__(self) -> Iterator[Batch]:
        plan = self.plan()
        shard = sum(hi - lo for _, lo, hi in plan)
        sizes = torch.diff(shard_bounds(shard, len(self))).tolist()
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 65_537 + self.rank)
        largest = min(_TRANSFORM_ROWS, max((hi - lo for _, lo, hi in plan), default=0))
        fill = min(self.buffer_rows, shard) if self.shuffle else max(sizes, default=1)
        buf: _Buffer
        if self.encoded is not None:
            slices = self._slices_of(plan)
            mapped = _MappedBuffer(fill + largest, self.spec.width, self.encoded, slices, self.kept)
            buf, added = mapped, self._mapped(mapped)
        else:
            # The transform runs on a prefetch thread; it only makes tensors from numpy (torch ops there would
            # start a second OpenMP team whose threads spin against the training thread's two).
            buf = rows_buf = _RowBuffer(fill + largest, self.spec.width)
            added = (rows_buf.add(*item) for item in _prefetched(self._chunks(plan)))
        try:
            k = yield from self._batches(buf, added, sizes, fill, g)
        finally:
            buf.close()
        if k != len(sizes) or buf.n:
            raise RuntimeError(f"streamed {k} of {len(sizes)} batches, {buf.n} rows left over; a bug")


def _slices(lo: int, hi: int, first: list[bool]) -> Iterator[tuple[int, int]]:
    """(start, rows) slices of [lo, hi): `_TRANSFORM_ROWS` each, the first of the epoch (`first[0]`) smaller."""
    a = lo
    while a < hi:
        n = min(_FIRST_SLICE_ROWS if first[0] else _TRANSFORM_ROWS, hi - a)
        first[0] = False
        yield a, n
        a += n


class _Buffer:
    """Rows waiting to be batched: slices are added at the end, batches drawn out (copies), holes refilled."""

    n = 0

    def take(self, rows: torch.Tensor) -> Batch:
        """The batch of buffer rows `rows`, in that order."""
        raise NotImplementedError

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy rows `src` onto rows `dst` (the source is read before anything is written)."""
        raise NotImplementedError

    def drain(
        self, sizes: list[int], k: int, keep: int, g: torch.Generator | None
    ) -> Generator[Batch, None, int]:
        """Yield batches sizes[k], sizes[k+1], ... while `keep` rows stay; returns the next batch number."""
        order = torch.randperm(self.n, generator=g) if g is not None else torch.arange(self.n)
        pos = 0
        while k < len(sizes) and self.n - pos - sizes[k] >= keep:
            yield self.take(order[pos : pos + sizes[k]])
            pos, k = pos + sizes[k], k + 1
        if g is None:  # in order: move the rows kept back to the front, keeping their order (< a batch)
            rest = order[pos:]
            self._move(torch.arange(rest.numel()), rest)
        else:  # shuffled: the next drain draws a fresh order, so only kept rows past the end fill the holes
            n_kept = self.n - pos
            holes, movers = order[:pos], order[pos:]
            self._move(holes[holes < n_kept], movers[movers >= n_kept])  # equal counts; copies <= pos rows
        self.n -= pos
        self.drained()
        return k

    def drained(self) -> None:
        """Called after each drain, once the buffer holds only its kept rows."""

    def close(self) -> None:
        """Called when the epoch's iteration ends (or stops early)."""

    def _move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # In chunks: a 30k-row move of feature rows at once allocates a 13 MB temporary, a fresh mapping above the
        # mmap threshold (training.runtime.malloc) that the kernel zeroes and faults in. Safe chunk by chunk:
        # shuffled, sources and destinations are disjoint; in order, sources lie after them.
        for a in range(0, dst.numel(), _MOVE_ROWS):
            self.move(dst[a : a + _MOVE_ROWS], src[a : a + _MOVE_ROWS])


class _RowBuffer(_Buffer):
    """Preallocated feature rows (the path that transforms as it reads): copied in, gathered out."""

    def __init__(self, capacity: int, width: int) -> None:
        self.x = torch.empty(capacity, width)
        self.y = torch.empty(capacity, 1)
        self.idx = torch.empty(capacity, dtype=torch.int64)

    def add(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> int:
        """Copy a transformed slice in at the end; returns its row count."""
        k = x.shape[0]
        self.x[self.n : self.n + k], self.y[self.n : self.n + k], self.idx[self.n : self.n + k] = x, y, idx
        self.n += k
        return k

    def take(self, rows: torch.Tensor) -> Batch:
        return self.x.index_select(0, rows), self.y.index_select(0, rows), self.idx.index_select(0, rows)

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        for t in (self.x, self.y, self.idx):
            t.index_copy_(0, dst, t.index_select(0, src))


class _MappedBuffer(_Buffer):
    """Row ids into the encoded split, which is mapped: a batch gathers and expands its records from the page cache.

    Copying each slice into a buffer of records, then moving 272-byte records to fill the holes a drain leaves,
    cost the training thread time on every batch; here a slice costs no copy and a refill moves 8-byte ids. A
    slice's pages are dropped from the process (MADV_DONTNEED) once its last row is drawn, so the mapped pages
    are those of the slices that still have rows in the buffer (~32 at the default sizes), not the file.
    """

    def __init__(
        self,
        capacity: int,
        width: int,
        path: Path,
        slices: list[tuple[int, int]],
        kept: KeptRows | None = None,
    ) -> None:
        self.width, self.slices, self.kept = width, slices, kept
        with path.open("rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: nothing is ever written
        if len(self.map) < max((a + n for a, n in slices), default=0) * RECORD.itemsize:
            self.map.close()
            raise DataError(f"{path} holds fewer records than expected (truncated?); delete it to rebuild")
        self.words: torch.Tensor | None = torch.from_numpy(
            np.frombuffer(self.map, np.int64).reshape(-1, _WORDS)
        )
        self.ids = torch.empty(capacity, dtype=torch.int64)  # each held row's record number in the split
        self.slice_of = torch.empty(capacity, dtype=torch.int64)  # ... and the slice it came from
        self.added = 0
        self.released = np.zeros(len(slices), bool)

    def will_need(self, i: int) -> None:
        """Ask the kernel to read slice `i` ahead."""
        self._advise(mmap.MADV_WILLNEED, *self.slices[i])

    def add_next(self) -> int:
        """Hold the next slice's rows (no copy; with negative sampling its kept rows); returns their count."""
        start, count = self.slices[self.added]
        if self.kept is None:
            self.ids[self.n : self.n + count] = torch.arange(start, start + count)
        else:
            records = torch.from_numpy(self.kept.records(start, start + count))
            count = records.numel()
            self.ids[self.n : self.n + count] = records
        self.slice_of[self.n : self.n + count] = self.added
        self.added += 1
        self.n += count
        return count

    def take(self, rows: torch.Tensor) -> Batch:
        assert self.words is not None, "the buffer was closed"
        records = self.words.index_select(0, self.ids.index_select(0, rows))
        return expand(records.numpy().view(RECORD).reshape(-1), self.width)

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        for t in (self.ids, self.slice_of):
            t.index_copy_(0, dst, t.index_select(0, src))

    def drained(self) -> None:
        live = torch.bincount(self.slice_of[: self.n], minlength=self.added).numpy()
        for i in np.flatnonzero((live[: self.added] == 0) & ~self.released[: self.added]):
            self._advise(mmap.MADV_DONTNEED, *self.slices[i])
            self.released[i] = True

    def close(self) -> None:
        """Unmap the split (later if a batch still views it; batches are copies, so none should)."""
        self.words = None
        with contextlib.suppress(
            BufferError
        ):  # an array still exports the map: it is unmapped when collected
            self.map.close()

    def _advise(self, advice: int, start: int, count: int) -> None:
        # madvise wants page-aligned offsets: only whole pages inside the slice (its edge pages stay mapped).
        lo = -(-start * RECORD.itemsize // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = (start + count) * RECORD.itemsize // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo:
            self.map.madvise(advice, lo, hi - lo)


def _prefetched(chunks: Iterator[Batch]) -> Iterator[Batch]:
    """Run `chunks` in a background thread, `_PREFETCH` items ahead; its exceptions surface here."""
    q: queue.Queue[Batch | BaseException | None] = queue.Queue(maxsize=_PREFETCH)
    stop = threading.Event()

    def put(item: Batch | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in chunks:
                if not put(item):
                    return
            put(None)
        except BaseException as e:  # handed to the consumer, which re-raises it
            put(e)

    thread = threading.Thread(target=produce, daemon=True, name="stream-prefetch")
    thread.start()
    try:
        while (item := q.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
