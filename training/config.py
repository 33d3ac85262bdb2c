"""TrainConfig: every knob of a training run, with the defaults `make train` uses."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ctr_contract.signatures import DEFAULT_WIDTH
from ctr_features.data.split import DEFAULT_VAL_FRACTION
from ctr_features.layout import HASH_START
from ctr_store.url import is_bucket_path
from training.errors import ConfigError

LOADERS = ("auto", "stream", "memory")
_RANGES = {"negative_sample_rate": " (the share of negatives kept: 0 < w <= 1)"}


@dataclass
class TrainConfig:
    """Settings of one run; `python -m training --help` documents each one."""

    data: Path | str = Path("artifacts/data/train.txt")  # str: an s3:// URL (a Path would fold its "//")
    out: Path = Path("artifacts/run")
    cache_dir: Path | None = None
    skip_bad_rows: bool = False
    max_rows: int | None = None
    val_fraction: float = DEFAULT_VAL_FRACTION
    width: int = DEFAULT_WIDTH
    loader: str = "auto"
    shuffle_buffer: int = 1 << 17
    activation: str = "relu"
    dropout1: float = 0.3
    dropout2: float = 0.2
    batch_size: int = 2048
    max_epochs: int = 3
    lr: float = 2e-3
    weight_decay: float = 0.0
    adam_impl: str = "auto"
    patience: int = 1
    seed: int = 42
    negative_sample_rate: float = 1.0
    threads: int | None = None
    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "auto"
    fast_dropout: bool = True
    malloc_tuning: bool = True
    ddp_timeout: float = 120.0
    resume: bool = False
    init_from: Path | None = None
    progress_bar: bool = True
    sample_audit: bool = False

    def __post_init__(self) -> None:
        self.data = str(self.data) if is_bucket_path(self.data) else Path(self.data)
        self.out = Path(self.out)
        self.init_from = Path(self.init_from) if self.init_from is not None else None
        self.cache_dir = Path(self.cache_dir) if self.cache_dir is not None else None
        checks = {
            "batch_size": self.batch_size >= 1,
            "max_epochs": self.max_epochs >= 1,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "devices": self.devices >= 1,
            "num_nodes": self.num_nodes >= 1,
            "ddp_timeout": self.ddp_timeout > 0,
            "patience": self.patience >= 0,
            "max_rows": self.max_rows is None or self.max_rows > 0,
            "val_fraction": 0 < self.val_fraction < 1,
            "width": self.width > HASH_START + 1,  # 52 fixed columns and the out-of-vocabulary count
            "threads": self.threads is None or self.threads >= 1,
            "loader": self.loader in LOADERS,
            "shuffle_buffer": self.shuffle_buffer >= 1,
            "dropout1": 0 <= self.dropout1 < 1,
            "dropout2": 0 <= self.dropout2 < 1,
            "negative_sample_rate": 0 < self.negative_sample_rate <= 1,  # NaN fails too
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(
                ", ".join(
                    f"invalid --{k.replace('_', '-')}: {getattr(self, k)!r}{_RANGES.get(k, '')}" for k in bad
                )
            )

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["data"], d["out"] = str(self.data), str(self.out)
        d["init_from"] = str(self.init_from) if self.init_from is not None else None
        d["cache_dir"] = str(self.cache_dir) if self.cache_dir is not None else None
        return d
