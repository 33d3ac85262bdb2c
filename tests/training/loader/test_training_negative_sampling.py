"""Negative downsampling (`--negative-sample-rate`): which rows are kept, by every loader and rank, and what a
run records."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from ctr_contract.schema import LABEL
from ctr_features.data.split import validation_mask
from ctr_features.spec import FeatureSpec
from ctr_model.checkpoint import load_net
from ctr_model.metrics import log_loss
from tests.training.reference_prepare import prepare_streaming
from tests.training.train_runs import TINY_RUN
from training.cli import main as training_main
from training.data.cache import cache_path, ensure_cache
from training.data.parquet import ParquetData
from training.loader.memory import ShuffledBatches
from training.loader.negatives import KeptRows, keep_mask, kept_rows
from training.loader.stream import StreamedBatches


def small_groups(data_copy: Path, rows_per_group: int = 500) -> Path:
    """The fixture's cache rewritten with small row groups (many pieces), as a plain Parquet input."""
    out = data_copy.parent / "small_groups.parquet"
    pq.write_table(pq.read_table(ensure_cache(data_copy)[0]), out, row_group_size=rows_per_group)
    return out


def train_ids_and_labels(data: ParquetData) -> tuple[np.ndarray, np.ndarray]:
    chunks = list(data.chunks("train", (LABEL,)))
    ids = np.concatenate([c.ids for c in chunks])
    return ids, np.concatenate([c.table.column(LABEL).to_numpy() for c in chunks])


def test_keep_mask_is_a_function_of_row_id_and_seed_only() -> None:
    ids = np.arange(50_000, dtype=np.int64) * 7 + 3
    labels = (ids % 5 == 0).astype(np.int8)
    mask = keep_mask(ids, labels, 0.3, seed=11)
    assert np.array_equal(mask, keep_mask(ids, labels, 0.3, seed=11))  # a second run
    perm = np.random.default_rng(0).permutation(len(ids))
    assert np.array_equal(keep_mask(ids[perm], labels[perm], 0.3, seed=11), mask[perm])  # per row, any order
    assert np.array_equal(keep_mask(ids[:100], labels[:100], 0.3, seed=11), mask[:100])  # any batch of rows
    assert not np.array_equal(keep_mask(ids, labels, 0.3, seed=12), mask)  # another seed, other negatives
    assert mask[labels == 1].all()  # every positive
    assert keep_mask(ids, np.zeros_like(labels), 1.0, seed=11).all()


@pytest.mark.parametrize("rate", [0.05, 0.25, 0.5, 0.9])
def test_the_kept_share_of_negatives_is_the_rate_within_binomial_bounds(rate: float) -> None:
    n = 400_000
    ids = np.arange(n, dtype=np.int64)
    kept = int(keep_mask(ids, np.zeros(n, np.int8), rate, seed=42).sum())
    assert abs(kept - n * rate) <= 5 * math.sqrt(n * rate * (1 - rate))  # 5 sigma
    # ... and on the training rows alone: the sampling hash is independent of the split's
    train = ids[~validation_mask(ids, 0.1)]
    kept_train = int(keep_mask(train, np.zeros(len(train), np.int8), rate, seed=42).sum())
    assert abs(kept_train - len(train) * rate) <= 5 * math.sqrt(len(train) * rate * (1 - rate))


@pytest.mark.parametrize("rate", [0.0, -0.5, 1.5, float("nan"), float("inf")])
def test_a_rate_outside_0_1_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match=r"negative sample rate must be in \(0, 1\], got"):
        keep_mask(np.arange(3), np.zeros(3), rate, seed=1)


@pytest.mark.parametrize("value", ["0", "-0.25", "1.01", "nan"])
def test_the_flag_outside_0_1_is_a_one_line_error_naming_it(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert training_main(["--negative-sample-rate", value, "--data", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: invalid --negative-sample-rate: {float(value)!r} (the share of negatives kept: 0 < w <= 1)\n"
    )


def test_rate_one_keeps_every_row_through_the_unsampled_path(data_copy: Path) -> None:
    data = ParquetData.open([small_groups(data_copy)], val_fraction=0.1)
    assert kept_rows(data, 1.0, seed=42) is None


def test_kept_rows_are_every_positive_and_the_hashed_negatives(data_copy: Path) -> None:
    data = ParquetData.open([small_groups(data_copy, 333)], val_fraction=0.1)
    kept = kept_rows(data, 0.3, seed=42)
    assert kept is not None
    ids, labels = train_ids_and_labels(data)
    expected = keep_mask(ids, labels, 0.3, seed=42)
    assert np.array_equal(kept.indices(), np.flatnonzero(expected))
    assert kept.rows == int(expected.sum()) and kept.total == data.rows("train")
    assert kept.positives == int(labels.sum()) and kept.negatives == len(labels) - int(labels.sum())
    assert kept.piece_counts.tolist() == [
        int(expected[p.train_start : p.train_start + p.train_rows].sum()) for p in data.pieces
    ]
    assert np.array_equal(kept.records(100, 900), 100 + np.flatnonzero(expected[100:900]))


def epoch_rows(
    data: ParquetData, spec: FeatureSpec, world: int, encoded: Path | None, rate: float, epoch: int = 0
) -> list[torch.Tensor]:
    """Each simulated rank's (index, label) rows of one epoch; every rank computes its own kept rows."""
    out = []
    for rank in range(world):
        own = ParquetData.from_json(data.to_json())  # a rank's own view of the data set
        kept = kept_rows(own, rate, seed=5)
        ds = StreamedBatches(
            own,
            spec,
            "train",
            128,
            seed=5,
            rank=rank,
            world_size=world,
            buffer_rows=700,
            encoded=encoded,
            kept=kept,
        )
        ds.set_epoch(epoch)
        batches = list(ds)
        assert len(batches) == len(ds)  # every rank the same number of steps
        out.append(torch.cat([torch.stack([b[2].double(), b[1].squeeze(1).double()], 1) for b in batches]))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_streamed_ranks_partition_the_kept_rows_and_agree_with_the_memory_loader(
    data_copy: Path, world: int
) -> None:
    data, spec, encoded = prepare_streaming([small_groups(data_copy)], 0.1, 128, None, print)
    kept = kept_rows(data, 0.25, seed=5)
    assert kept is not None
    _, labels = train_ids_and_labels(data)
    for source in (encoded["train"], None):  # the mapped records and the transforming path
        shards = epoch_rows(data, spec, world, source, 0.25)
        rows = torch.cat(shards)
        assert np.array_equal(np.sort(rows[:, 0].long().numpy()), kept.indices())  # each kept row once
        assert np.array_equal(rows[:, 1].numpy(), labels[rows[:, 0].long().numpy()])  # each with its label
        assert int(rows[:, 1].sum()) == kept.positives == int(labels.sum())  # every positive
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        again = epoch_rows(data, spec, world, source, 0.25)
        assert all(torch.equal(a, b) for a, b in zip(shards, again, strict=True))  # determinism
    rows_t = torch.from_numpy(kept.indices())
    n = data.rows("train")
    memory = [
        ShuffledBatches(torch.zeros(n, 1), torch.zeros(n), 128, seed=5, rank=r, world_size=world, rows=rows_t)
        for r in range(world)
    ]
    seen = torch.cat([b[2] for m in memory for b in m]).numpy()
    assert np.array_equal(np.sort(seen), kept.indices())
    assert len({len(m) for m in memory}) == 1


def test_the_validation_split_is_never_sampled(data_copy: Path) -> None:
    data, spec, encoded = prepare_streaming([small_groups(data_copy)], 0.1, 128, None, print)
    kept = kept_rows(data, 0.5, seed=1)
    with pytest.raises(ValueError, match="negative sampling applies to the training split only, not 'val'"):
        StreamedBatches(data, spec, "val", 128, encoded=encoded["val"], kept=kept)


def audit(out: Path) -> list[np.ndarray]:
    return [np.sort(np.load(out / "sample_audit" / f"epoch{e}_rank0.npy")) for e in range(2)]


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_a_sampled_run_records_the_rate_trains_on_the_kept_rows_and_keeps_validation_whole(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    runs = {}
    for name, rate, loader in (
        ("full", "1", "memory"),
        ("memory", "0.5", "memory"),
        ("stream", "0.5", "stream"),
    ):
        out = tmp_path / name
        proc = run_module(
            "training",
            "--data",
            data_copy,
            "--out",
            out,
            *TINY_RUN,
            "--sample-audit",
            "--negative-sample-rate",
            rate,
            "--loader",
            loader,
            check=True,
        )
        runs[name] = (out, proc.stdout, json.loads((out / "metrics.json").read_text()))
    full, m_full = runs["full"][0], runs["full"][2]
    assert m_full["negative_sample_rate"] == 1.0 and m_full["negative_sampling"] is None
    assert m_full["train_rows_kept"] == m_full["train_rows"]
    assert m_full["val_logloss"] == m_full["val_logloss_uncorrected"]
    data, _, _ = prepare_streaming([cache_path(data_copy)], 0.1, 128, None, print)
    kept = kept_rows(data, 0.5, seed=42)
    assert isinstance(kept, KeptRows)
    for name in ("memory", "stream"):
        out, stdout, m = runs[name]
        assert m["negative_sample_rate"] == 0.5 and m["negative_sampling"] == kept.summary()
        assert m["train_rows"] == m_full["train_rows"] and m["train_rows_kept"] == kept.rows
        assert m["global_step"] == 2 * math.ceil(kept.rows / 256)
        assert m["val_rows"] == m_full["val_rows"]
        net, ckpt = load_net(out / "checkpoints" / "best.ckpt")
        assert ckpt["hyper_parameters"]["negative_sample_rate"] == 0.5
        # val_logloss is of q = sigmoid(z + ln w) over every validation row (all in val_features.npy here)
        x, y = np.load(out / "val_features.npy"), np.load(out / "val_labels.npy")
        assert len(y) == m["val_rows"]
        with torch.no_grad():
            z = net(torch.from_numpy(x)).squeeze(1).double()
        q = torch.sigmoid(z + math.log(0.5)).numpy()
        assert m["val_logloss"] == pytest.approx(log_loss(y, q), abs=1e-6)
        assert m["val_logloss_uncorrected"] == pytest.approx(log_loss(y, torch.sigmoid(z).numpy()), abs=1e-6)
        logged = [
            float(r["val_logloss"])
            for r in csv.DictReader((out / "logs" / "metrics.csv").open())
            if r.get("val_logloss")
        ]
        assert min(abs(v - m["val_logloss"]) for v in logged) < 2e-3  # the best epoch's, logged in training
        for f in ("val_features.npy", "val_labels.npy", "val_raw.npz", "train_features_sample.npy"):
            assert (out / f).read_bytes() == (full / f).read_bytes(), f  # export's rows: all of them
        assert all(np.array_equal(a, kept.indices()) for a in audit(out))
        assert kept.line() in stdout
        assert (
            f"fit {m['fit_seconds']:.1f}s on {kept.rows:,} of {kept.total:,} training rows an epoch" in stdout
        )
        assert "saved (estimate: the epochs' training time scaled by rows" in stdout
        assert m["fit_seconds_all_rows_estimate"] > m["fit_seconds"]
    assert all(np.array_equal(a, np.arange(m_full["train_rows"])) for a in audit(full))
    # a resumed run keeps its rate
    proc = run_module(
        "training",
        "--data",
        data_copy,
        "--out",
        runs["stream"][0],
        *TINY_RUN,
        "--resume",
        "--negative-sample-rate",
        "0.25",
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {runs['stream'][0] / 'checkpoints' / 'last.ckpt'} was trained with --negative-sample-rate 0.5, "
        "not 0.25; resume with the same rate or run without --resume"
    )


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_two_gloo_ranks_partition_the_kept_rows_of_several_files(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    lines = data_copy.read_text().splitlines(keepends=True)
    days = tmp_path / "days"
    days.mkdir()
    for i in range(3):
        (days / f"day_{i}").write_text("".join(lines[i * 1334 : (i + 1) * 1334]))
    out = tmp_path / "run"
    run_module(
        "training",
        "--data",
        days,
        "--out",
        out,
        *TINY_RUN,
        "--devices",
        "2",
        "--accelerator",
        "cpu",
        "--strategy",
        "ddp",
        "--sample-audit",
        "--loader",
        "stream",
        "--shuffle-buffer",
        "700",
        "--negative-sample-rate",
        "0.4",
        check=True,
    )
    m = json.loads((out / "metrics.json").read_text())
    data = ParquetData.open(sorted(days.glob("day_*.cache.parquet")), 0.1)
    kept = kept_rows(data, 0.4, seed=42)
    assert kept is not None and m["world_size"] == 2 and m["negative_sampling"] == kept.summary()
    for epoch in range(2):
        shards = [np.load(out / "sample_audit" / f"epoch{epoch}_rank{rank}.npy") for rank in range(2)]
        assert abs(len(shards[0]) - len(shards[1])) <= 1
        assert np.array_equal(np.sort(np.concatenate(shards)), kept.indices())


def test_export_samples_cap_validation_and_training_rows_apart_on_both_loaders(data_copy: Path) -> None:
    from training.config import TrainConfig
    from training.data.samples import samples
    from training.loader.inputs import load_inputs

    got = []
    for loader in ("memory", "stream"):
        cfg = TrainConfig(data=data_copy, loader=loader, negative_sample_rate=0.5)
        inputs = load_inputs(cfg, None, lambda _: None)
        val_x, val_y, train_x = samples(inputs, 300, 100)
        assert val_x.shape == (300, 128) and val_y.shape == (300,) and train_x.shape == (100, 128)
        got.append((val_x.tobytes(), val_y.tobytes(), train_x.tobytes()))
    assert got[0] == got[1]  # the same rows, whatever the loader, all rows of both splits
