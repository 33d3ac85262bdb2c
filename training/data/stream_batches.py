"""Streaming input: whole batches from Parquet row groups through a shuffle buffer, each rank its own rows.

Per epoch, the row groups are put in a seeded order (a permutation when shuffling) and that order's rows
of the split are cut into `world` contiguous ranges that differ by at most one row; rank r reads only the
row groups its range touches (two ranks share a boundary group, each keeping its own rows), so there are
never idle ranks, even with more ranks than row groups. Each rank fills a buffer of `buffer_rows`
transformed rows, hands out whole batches of randomly drawn rows until half of it is left, then refills,
so rows mix across row groups; while it first fills, it already hands out half of each slice's rows (so the
first step does not wait for a whole buffer). Every rank makes ceil(ceil(N / world) / batch) batches (DDP needs equal step
counts): across ranks each row is seen exactly once per epoch. The order depends only on (seed, epoch,
rank), so a resumed run replays it. A background thread reads and transforms the next row groups while
the model trains on the current ones. Memory per process: the buffer (buffer_rows + 32k encoded records of 272 bytes), one
decoded row group and a few 32k-row slices in flight, whatever the row count.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset

from ctr_contract.schema import LABEL
from training.data.batches import Batch, shard_bounds
from training.data.feature_cache import RECORD, RecordFile, expand, transform_chunk
from training.data.parquet import ParquetData, Piece, Split
from training.features.spec import FeatureSpec

DEFAULT_BUFFER_ROWS = 1 << 17  # one cache row group: 64 MiB of float32 features at width 128
_PREFETCH = 2  # transformed slices waiting in the queue (one more is being transformed)
_READAHEAD = 2  # encoded slices the kernel is asked to read ahead
_MOVE_ROWS = 1 << 12  # rows per chunk when the buffer fills its holes
_TRANSFORM_ROWS = 1 << 15
_FIRST_SLICE_ROWS = 1 << 12
_WORDS = (
    RECORD.itemsize // 8
)  # a record is 34 int64 words  # two batches of 2048: the ramp-up hands out one while the next slices load


def epoch_plan(
    pieces: list[Piece], split: Split, order: np.ndarray, rank: int, world: int
) -> list[tuple[Piece, int, int]]:
    """(piece, lo, hi): the slices of each piece's split rows that `rank` reads, in `order`."""
    counts = np.array([pieces[i].count(split) for i in order], dtype=np.int64)
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

    def __init__(self, data: ParquetData, spec: FeatureSpec, split: Split, batch_size: int, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1,
                 buffer_rows: int = DEFAULT_BUFFER_ROWS, encoded: Path | None = None) -> None:  # fmt: skip
        super().__init__()
        n = data.rows(split)
        if n < world_size:
            raise ValueError(
                f"{n} {split} rows cannot be shared by {world_size} ranks; use fewer --devices or more data"
            )
        self.data, self.spec, self.split = data, spec, split
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size, self.buffer_rows = rank, world_size, max(buffer_rows, batch_size)
        self.rows, self.encoded = n, encoded
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
        return epoch_plan(self.data.pieces, self.split, order, self.rank, self.world_size)

    def _chunks(self, plan: list[tuple[Piece, int, int]]) -> Iterator[Batch]:
        """The transforming path's slices; runs on the prefetch thread (see `__iter__`)."""
        first = [True]  # the epoch's first slice is small, so its first batch comes after a few thousand rows
        for piece, lo, hi in plan:
            chunk = self.data.read(piece, self.split)
            for a, n in _slices(lo, hi, first):  # slices bound the transform's temporaries
                table = chunk.table.slice(a, n)
                x = torch.from_numpy(transform_chunk(self.spec, table))
                y = torch.from_numpy(table.column(LABEL).to_numpy().astype(np.float32)).reshape(-1, 1)
                yield x, y, torch.from_numpy(chunk.index[a : a + len(table)])

    def _records(self, plan: list[tuple[Piece, int, int]], buf: _RecordBuffer) -> Iterator[int]:
        """The encoded path: each slice read straight into `buf`'s free rows; yields the rows added.

        No thread: the kernel reads `_READAHEAD` slices ahead (posix_fadvise WILLNEED) while the model trains, and
        each slice is then one copy from the page cache into the buffer (1.2 ms per 32k rows). A reading thread
        with its own arrays cost a second copy per slice and took cores from torch's OpenMP team at random.
        """
        assert self.encoded is not None
        first = [True]
        slices = [
            (piece.start(self.split) + a, n) for piece, lo, hi in plan for a, n in _slices(lo, hi, first)
        ]
        with RecordFile(self.encoded) as records:
            for start, n in slices[:_READAHEAD]:
                records.will_need(start, n)
            for i, (start, n) in enumerate(slices):
                if i + _READAHEAD < len(slices):
                    records.will_need(*slices[i + _READAHEAD])
                yield buf.read(records, start, n)

    def __iter__(self) -> Iterator[Batch]:
        plan = self.plan()
        shard = sum(hi - lo for _, lo, hi in plan)
        sizes = torch.diff(shard_bounds(shard, len(self))).tolist()
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 65_537 + self.rank)
        largest = min(_TRANSFORM_ROWS, max((hi - lo for _, lo, hi in plan), default=0))
        fill = min(self.buffer_rows, shard) if self.shuffle else max(sizes, default=1)
        buf: _Buffer
        if self.encoded is not None:
            buf = _RecordBuffer(fill + largest, self.spec.width)
            added = self._records(plan, buf)
        else:
            # The transform runs on a prefetch thread; it only makes tensors from numpy (torch ops there would
            # start a second OpenMP team whose threads spin against the training thread's two).
            buf = rows_buf = _RowBuffer(fill + largest, self.spec.width)
            added = (rows_buf.add(*item) for item in _prefetched(self._chunks(plan)))
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
        k = yield from buf.drain(sizes, k, 0, g if self.shuffle else None)
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
        if (
            g is None
        ):  # in order: move the rows kept back to the front, keeping their order (less than a batch)
            rest = order[pos:]
            self._move(torch.arange(rest.numel()), rest)
        else:  # shuffled: the next drain draws a fresh order, so only kept rows past the end fill the holes
            n_kept = self.n - pos
            holes, movers = order[:pos], order[pos:]
            self._move(holes[holes < n_kept], movers[movers >= n_kept])  # equal counts; copies <= pos rows
        self.n -= pos
        return k

    def _move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # In chunks: a 30k-row move at once allocates 8-13 MB temporaries, fresh mappings above the mmap threshold
        # (training.model.malloc) that the kernel zeroes and faults in (2.4 ms, against 0.1 ms per 4k rows). Safe
        # chunk by chunk: shuffled, sources and destinations are disjoint; in order, sources lie after them.
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


class _RecordBuffer(_Buffer):
    """Preallocated encoded records (272 bytes a row, against 524 expanded): a batch is expanded as it is drawn.

    Expanding each slice into float rows on arrival, then moving 512-byte rows to fill holes, cost 1.4 ms of the
    training thread per batch (the in-memory path: 0.2 ms); records are half the bytes to move, and expanding a
    batch's 2048 rows stays in cache.
    """

    def __init__(self, capacity: int, width: int) -> None:
        # Held as 8-byte words so that torch gathers and moves whole records (numpy's fancy indexing copies a
        # structured dtype's items one at a time: 0.5 ms a batch).
        self.words = torch.empty(capacity, _WORDS, dtype=torch.int64)
        self.width = width

    def read(self, records: RecordFile, start: int, count: int) -> int:
        """Read records [start, start + count) of the split into the next free rows; returns `count`."""
        records.read_into(start, self.words[self.n : self.n + count].numpy().view(np.uint8))
        self.n += count
        return count

    def take(self, rows: torch.Tensor) -> Batch:
        return expand(self.words.index_select(0, rows).numpy().view(RECORD).reshape(-1), self.width)

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.words.index_copy_(0, dst, self.words.index_select(0, src))


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
