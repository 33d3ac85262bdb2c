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
the model trains on the current ones. Memory per process: the buffer (buffer_rows + 32k feature rows), one
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
from training.data.feature_cache import expand_into, read_records, transform_chunk
from training.data.parquet import ParquetData, Piece, Split
from training.features.spec import FeatureSpec

DEFAULT_BUFFER_ROWS = 1 << 17  # one cache row group: 64 MiB of float32 features at width 128
_PREFETCH = 2  # transformed slices waiting in the queue (one more is being transformed)
_TRANSFORM_ROWS = 1 << 15
_FIRST_SLICE_ROWS = 1 << 12  # two batches of 2048: the ramp-up hands out one while the next slices load


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

    def _chunks(self, plan: list[tuple[Piece, int, int]]) -> Iterator[Batch | np.ndarray]:
        """Runs on the prefetch thread: numpy and pyarrow only, never a torch op (see `__iter__`)."""
        first = [True]  # the epoch's first slice is small, so its first batch comes after a few thousand rows
        for piece, lo, hi in plan:
            if self.encoded is not None:  # transformed once already: read here, expand on the training thread
                for a, n in _slices(lo, hi, first):
                    yield read_records(self.encoded, piece.start(self.split) + a, n)
                continue
            chunk = self.data.read(piece, self.split)
            for a, n in _slices(lo, hi, first):  # slices bound the transform's temporaries
                table = chunk.table.slice(a, n)
                x = torch.from_numpy(transform_chunk(self.spec, table))
                y = torch.from_numpy(table.column(LABEL).to_numpy().astype(np.float32)).reshape(-1, 1)
                yield x, y, torch.from_numpy(chunk.index[a : a + len(table)])

    def __iter__(self) -> Iterator[Batch]:
        plan = self.plan()
        shard = sum(hi - lo for _, lo, hi in plan)
        sizes = torch.diff(shard_bounds(shard, len(self))).tolist()
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 65_537 + self.rank)
        largest = min(_TRANSFORM_ROWS, max((hi - lo for _, lo, hi in plan), default=0))
        fill = min(self.buffer_rows, shard) if self.shuffle else max(sizes, default=1)
        buf = _RowBuffer(fill + largest, self.spec.width)
        k = 0
        for item in _prefetched(self._chunks(plan)):
            # torch ops on the prefetch thread would start a second OpenMP team whose threads spin against the
            # training thread's two (1M-row epoch: 166k vs 218k samples/s in memory); so records are expanded here.
            # Records are expanded straight into the buffer's rows: no fresh 16 MB tensor (and its page faults) per slice.
            rows = buf.add_records(item) if isinstance(item, np.ndarray) else buf.add(*item)
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


class _RowBuffer:
    """Preallocated rows waiting to be batched: chunks are copied in, batches are gathered out (copies)."""

    def __init__(self, capacity: int, width: int) -> None:
        self.x = torch.empty(capacity, width)
        self.y = torch.empty(capacity, 1)
        self.idx = torch.empty(capacity, dtype=torch.int64)
        self.n = 0

    def add(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> int:
        """Copy a transformed slice in; returns its row count."""
        k = x.shape[0]
        self.x[self.n : self.n + k], self.y[self.n : self.n + k], self.idx[self.n : self.n + k] = x, y, idx
        self.n += k
        return k

    def add_records(self, rec: np.ndarray) -> int:
        """Expand encoded records straight into the next rows; returns their count."""
        k = len(rec)
        expand_into(rec, self.x[self.n : self.n + k])
        self.y[self.n : self.n + k, 0] = torch.from_numpy(np.ascontiguousarray(rec["y"]))
        self.idx[self.n : self.n + k] = torch.from_numpy(np.ascontiguousarray(rec["index"]))
        self.n += k
        return k

    def drain(
        self, sizes: list[int], k: int, keep: int, g: torch.Generator | None
    ) -> Generator[Batch, None, int]:
        """Yield batches sizes[k], sizes[k+1], ... while `keep` rows stay; returns the next batch number."""
        order = torch.randperm(self.n, generator=g) if g is not None else torch.arange(self.n)
        pos = 0
        while k < len(sizes) and self.n - pos - sizes[k] >= keep:
            rows = order[pos : pos + sizes[k]]
            yield self.x.index_select(0, rows), self.y.index_select(0, rows), self.idx.index_select(0, rows)
            pos, k = pos + sizes[k], k + 1
        if (
            g is None
        ):  # in order: move the rows kept back to the front, keeping their order (less than a batch)
            rest = order[pos:]
            self.x[: rest.numel()] = self.x.index_select(0, rest)
            self.y[: rest.numel()] = self.y.index_select(0, rest)
            self.idx[: rest.numel()] = self.idx.index_select(0, rest)
        else:  # shuffled: the next drain draws a fresh order, so only kept rows past the end fill the holes
            n_kept = self.n - pos
            holes, movers = order[:pos], order[pos:]
            holes, movers = (
                holes[holes < n_kept],
                movers[movers >= n_kept],
            )  # equal counts; copies <= pos rows
            for t in (self.x, self.y, self.idx):
                t.index_copy_(0, holes, t.index_select(0, movers))
        self.n -= pos
        return k


def _prefetched(chunks: Iterator[Batch | np.ndarray]) -> Iterator[Batch | np.ndarray]:
    """Run `chunks` in a background thread, `_PREFETCH` items ahead; its exceptions surface here."""
    q: queue.Queue[Batch | np.ndarray | BaseException | None] = queue.Queue(maxsize=_PREFETCH)
    stop = threading.Event()

    def put(item: Batch | np.ndarray | BaseException | None) -> bool:
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
