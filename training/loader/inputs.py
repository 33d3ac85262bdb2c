"""A run's inputs, step by step: `--data` -> files -> Parquet -> prepared splits and spec -> loader.

`load_inputs` is the data walk's one driver: each step below is one call, made once and in order, and
nothing downstream calls back into it. `training.loader.datamodule` then turns the result into each rank's
batches; `training.data.samples` reads the rows export needs once training is done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from ctr_contract import cgroup
from ctr_features.data.criteo import ReadReport
from ctr_features.spec import FeatureSpec
from training.config import TrainConfig
from training.data.parquet import ParquetData, Split
from training.data.preparation import prepare_data
from training.data.rank_group import launched_group
from training.errors import DataError
from training.loader.memory import PreparedData, load_in_memory
from training.loader.negatives import KeptRows, kept_rows

# `--loader auto` holds the data in memory when its float32 features take at most this much per process
# (about 2M rows at width 128) and at most a quarter of the memory available to the processes on this host.
MEMORY_LOADER_MAX_BYTES = 1 << 30


@dataclass
class RunInputs:
    """The data set, its fitted (or frozen) spec, the loader picked, the in-memory arrays if any, and the
    training rows kept by negative sampling (None: all of them)."""

    data: ParquetData
    spec: FeatureSpec
    loader: str
    memory: PreparedData | None
    report: ReadReport
    encoded: dict[Split, Path]
    kept: KeptRows | None = None

    def rows(self, split: Split) -> int:
        return self.data.rows(split)

    def trained_rows(self) -> int:
        """Training rows an epoch visits: the kept ones under negative sampling, else the split's."""
        return self.kept.rows if self.kept is not None else self.rows("train")


def load_inputs(cfg: TrainConfig, frozen: FeatureSpec | None, say: Callable[[str], None]) -> RunInputs:
    """Resolve `--data`, parse text files once into Parquet caches, prepare the splits and pick the loader.

    Args:
        cfg: the run settings (data, skip_bad_rows, val_fraction, width, max_rows, loader, devices).
        frozen: a spec to use as is (warm start) instead of fitting one.
        say: prints progress once per job.
    """
    width = frozen.width if frozen is not None else cfg.width
    # 1-3. the files `--data` names, text parsed once into Parquet caches, the spec fitted on the training
    # rows and both splits encoded with it, in the cache folder; under torchrun every rank does its share
    with launched_group(cfg.ddp_timeout) as group:
        prepared = prepare_data(
            cfg.data,
            cfg.cache_dir,
            cfg.val_fraction,
            width,
            cfg.max_rows,
            cfg.skip_bad_rows,
            say,
            frozen,
            group,
        )
    pa.default_memory_pool().release_unused()  # the preparation's buffers: do not carry them into training
    data, spec, encoded, report = prepared.data, prepared.spec, prepared.encoded, prepared.report
    # 4. negative sampling of the training rows, after the preparation (the same at every rate)
    kept = kept_rows(data, cfg.negative_sample_rate, cfg.seed)
    trained = kept.rows if kept is not None else data.rows("train")
    if trained < cfg.world_size:
        sampled = f" (--negative-sample-rate {cfg.negative_sample_rate:g})" if kept is not None else ""
        raise DataError(
            f"{trained} training rows{sampled} cannot be shared by {cfg.world_size} processes; "
            "use fewer --devices / --num_nodes or more data"
        )
    loader, why = choose_loader(cfg.loader, data, spec.width, cfg.devices)  # 5. memory or stream
    n_files = f" ({len(data.files)} files)" if len(data.files) > 1 else ""
    say(f"data: {cfg.data}{n_files}: {report.summary()}")
    say(
        f"loader: {loader} ({why})"
        + (f", shuffle buffer {cfg.shuffle_buffer} rows" if loader == "stream" else "")
    )
    if kept is not None:
        say(kept.line())
    pa.default_memory_pool().release_unused()
    memory = load_in_memory(data, spec, encoded) if loader == "memory" else None  # 6. arrays, if memory
    return RunInputs(data, spec, loader, memory, report, encoded, kept)


def choose_loader(requested: str, data: ParquetData, width: int, local_ranks: int) -> tuple[str, str]:
    """`memory` or `stream`, and the reason, for `--loader requested` ("auto", "memory" or "stream")."""
    need = (data.rows("train") + data.rows("val")) * width * 4
    if requested != "auto":
        return requested, f"--loader {requested}"
    available = _available_memory()
    budget = (
        MEMORY_LOADER_MAX_BYTES
        if available is None
        else min(MEMORY_LOADER_MAX_BYTES, available // (4 * local_ranks))
    )
    if need <= budget:
        return "memory", f"features take {need / 2**20:.0f} MiB per process <= {budget / 2**20:.0f} MiB"
    return "stream", f"features would take {need / 2**20:.0f} MiB per process > {budget / 2**20:.0f} MiB"


def _available_memory() -> int | None:
    # The container's memory limit, not the node's: /proc/meminfo alone would size a 4 GiB pod by its node.
    return cgroup.available_memory()
