"""A run's inputs: `--data` resolved to Parquet (text parsed once into caches), the spec, and the loader.

Also the run's read-only passes over the validation rows and the export samples, which stream on the
`stream` loader, so no step of a streamed run holds all rows of a split in memory.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from ctr_contract.schema import LABEL
from training.config import TrainConfig
from training.criteo import ReadReport
from training.dataset import PreparedData, choose_loader, load_in_memory
from training.feature_cache import expand, iter_records, read_records
from training.features import FeatureSpec
from training.net import CTRNet
from training.preparation import prepare_data
from training.rank_group import launched_group
from training.sources import DataError
from training.stream import ParquetData, Split

_SCORE_ROWS = 1 << 16  # rows per forward pass when scoring the validation split


@dataclass
class RunInputs:
    """The data set, its fitted (or frozen) spec, the loader picked, and the in-memory arrays if any."""

    data: ParquetData
    spec: FeatureSpec
    loader: str
    memory: PreparedData | None
    report: ReadReport
    encoded: dict[Split, Path]

    def rows(self, split: Split) -> int:
        return self.data.rows(split)

    def batches_source(self) -> PreparedData | tuple[ParquetData, FeatureSpec, dict[Split, Path]]:
        return self.memory if self.memory is not None else (self.data, self.spec, self.encoded)

    def _records(self, split: Split) -> Iterator[np.ndarray]:
        return iter_records(self.encoded[split], self.rows(split))

    def score_val(self, net: CTRNet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(click probabilities float64, labels float32, global row ids) of every validation row, file order."""
        if self.memory is not None:
            m = self.memory
            parts: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(
                [(torch.from_numpy(m.val_x[s : s + _SCORE_ROWS]), torch.from_numpy(m.val_y[s : s + _SCORE_ROWS]))
                 for s in range(0, len(m.val_y), _SCORE_ROWS)]
            )  # fmt: skip
        else:
            parts = (expand(r, self.spec.width)[:2] for r in self._records("val"))
        probs, labels = [], []
        with torch.no_grad():
            for x, y in parts:
                probs.append(net.predict_proba(x).squeeze(1).numpy())
                labels.append(y.reshape(-1).numpy())
        return np.concatenate(probs).astype(np.float64), np.concatenate(labels), self.val_ids()

    def val_ids(self) -> np.ndarray:
        """Global row ids of the validation rows in file order (for the synthetic oracle)."""
        return np.concatenate(
            [self.data.read(p, "val", (LABEL,)).ids for p in self.data.pieces if p.val_rows]
        )

    def samples(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first n validation rows (x, y) and n training rows spread over the data (every k-th row)."""
        stride = max(1, self.rows("train") // n)
        if self.memory is not None:
            m = self.memory
            return m.val_x[:n], m.val_y[:n], m.train_x[::stride][:n]
        val_x, val_y, _ = expand(
            read_records(self.encoded["val"], 0, min(n, self.rows("val"))), self.spec.width
        )
        picked = [r[(r["index"] % stride == 0) & (r["index"] // stride < n)] for r in self._records("train")]
        train_x = expand(np.concatenate(picked), self.spec.width)[0]
        return val_x.numpy(), val_y.reshape(-1).numpy(), train_x.numpy()


def pin_malloc_mmap_threshold(nbytes: int = 1 << 20) -> bool:
    """Fix glibc's mmap threshold so that buffers of 1 MiB and more always go back to the system when freed.

    glibc raises the threshold (up to 32 MiB) each time it frees an mmapped block; the stream's row slices and
    buffer copies are such blocks, so without this the heap keeps their freed space and fragments: measured,
    an epoch over 10M rows peaked at 1.28 GB instead of 0.72 GB. Returns False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_mmap_threshold = -3  # from <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, nbytes))


def load_inputs(cfg: TrainConfig, frozen: FeatureSpec | None, say: Callable[[str], None]) -> RunInputs:
    """Resolve `--data`, parse text files once into Parquet caches, open the data set and fit (or take) the spec.

    Args:
        cfg: the run settings (data, skip_bad_rows, val_fraction, width, max_rows, loader, devices).
        frozen: a spec to use as is (warm start) instead of fitting one.
        say: prints progress once per job.
    """
    pin_malloc_mmap_threshold()
    width = frozen.width if frozen is not None else cfg.width
    with launched_group(cfg.ddp_timeout) as group:  # under torchrun every rank prepares its share
        prepared = prepare_data(cfg.data, cfg.cache_dir, cfg.val_fraction, width, cfg.max_rows,
                                cfg.skip_bad_rows, say, frozen, group)  # fmt: skip
    pa.default_memory_pool().release_unused()  # the preparation's buffers: do not carry them into training
    data, spec, encoded, report = prepared.data, prepared.spec, prepared.encoded, prepared.report
    if data.rows("train") < cfg.world_size:
        raise DataError(
            f"{data.rows('train')} training rows cannot be shared by {cfg.world_size} processes; "
            "use fewer --devices / --num_nodes or more data"
        )
    loader, why = choose_loader(cfg.loader, data, spec.width, cfg.devices)
    n_files = f" ({len(data.files)} files)" if len(data.files) > 1 else ""
    say(f"data: {cfg.data}{n_files}: {report.summary()}")
    say(
        f"loader: {loader} ({why})"
        + (f", shuffle buffer {cfg.shuffle_buffer} rows" if loader == "stream" else "")
    )
    pa.default_memory_pool().release_unused()
    memory = load_in_memory(data, spec, encoded) if loader == "memory" else None
    return RunInputs(data, spec, loader, memory, report, encoded)
