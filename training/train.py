"""One training run end to end: data -> Parquet -> spec -> Lightning fit -> run directory (the export contract)."""

from __future__ import annotations

import json
import logging
import shutil
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from ctr_contract import cgroup, run_dir
from ctr_contract.stage_trace import run as run_span
from ctr_contract.stage_trace import stage as trace_stage
from ctr_model.checkpoint import load_net
from ctr_model.errors import CheckpointError
from ctr_model.metrics import log_loss, roc_auc
from ctr_model.net import ModelConfig
from training.config import TrainConfig
from training.data.samples import first_val_rows, samples, save_val_raw, score_val
from training.loader.datamodule import CTRDataModule
from training.loader.inputs import RunInputs, load_inputs
from training.model.callbacks import SampleAudit, TrainThroughput
from training.model.distributed import build_strategy, explain_rendezvous_failures, launch_rank
from training.model.lightning_module import CTRModule
from training.model.warm_start import load_warm_start
from training.runtime.malloc import keep_freed_memory, return_large_blocks, step_tensor_bytes
from training.runtime.speed import SpeedSettings
from training.synth import oracle_paths

# Validation rows kept for export: its calibrator is fitted on them, and a mean click rate of 10,000 rows is off by
# ~1.7% (relative) by chance alone; 50,000 rows cost 25 MB at width 128. The drift reference needs fewer.
VAL_FEATURES_ROWS = 50_000
TRAIN_SAMPLE_ROWS = 10_000


class _DropAdverts(logging.Filter):
    """Lightning 2.6 prints a cloud-logging advert at every Trainer start; it is noise in a CLI's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip: For seamless cloud logging" not in record.getMessage()


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropAdverts())


def say(msg: str) -> None:
    """Print once per job (global rank 0 as the launcher set it)."""
    if launch_rank() == 0:
        print(msg, flush=True)


def run_training(cfg: TrainConfig, callbacks: Sequence[L.Callback] = ()) -> dict[str, Any] | None:
    """Train and write `cfg.out`: checkpoints/{best,last}.ckpt, feature_spec.json, metrics.json, val_features.npy.

    The one entry point of a run: `python -m training` parses its options into `cfg` (training/cli.py's
    `parse_config`) and calls this; the online trainer and tuning trials call it in their own process.

    Args:
        cfg: run settings.
        callbacks: extra Lightning callbacks (appended after the built-in ones).
    Returns:
        The metrics dict on global rank 0; None on other ranks.
    Raises:
        TrainingError: a problem the user can fix (bad data, NaN loss, DDP setup), its message one line.
    """
    with run_span("training"):  # a span per stage with the OTEL_* variables (ctr_contract/stage_trace.py)
        return _train(cfg, callbacks)


def _train(cfg: TrainConfig, callbacks: Sequence[L.Callback]) -> dict[str, Any] | None:
    t_start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    threads = cfg.threads
    if threads is None and cfg.accelerator == "cpu":
        # N CPU ranks share the container's CPU limit (cgroup), not the node's cores.
        threads = max(1, cgroup.available_cpus() // cfg.devices)
    if threads:
        torch.set_num_threads(threads)
    largest = step_tensor_bytes(cfg.batch_size, (cfg.width, ModelConfig.hidden1, ModelConfig.hidden2))
    malloc = keep_freed_memory(largest) if cfg.malloc_tuning else return_large_blocks()
    speed = SpeedSettings.choose(
        cfg.accelerator, cfg.fast_dropout, cfg.adam_impl, cfg.precision, threads, cfg.threads is None, malloc
    )
    speed_callbacks = speed.callbacks()
    ckpt_dir = cfg.out / run_dir.CHECKPOINTS_DIR
    resume_from = _resume_checkpoint(cfg, ckpt_dir)
    t0 = time.perf_counter()
    warm = load_warm_start(cfg.init_from) if cfg.init_from is not None and resume_from is None else None
    if warm is not None:
        say(
            f"warm start from {warm.source}: its weights and its frozen feature spec (width {warm.spec.width})"
        )
    with trace_stage("prepare"):
        data = load_inputs(cfg, warm.spec if warm else None, say)
    say(
        f"features: {data.rows('train')} train / {data.rows('val')} val rows -> float32 [N, {data.spec.width}] in {time.perf_counter() - t0:.1f}s"
    )
    model_cfg = (
        warm.model
        if warm is not None
        else ModelConfig(
            width=cfg.width, activation=cfg.activation, dropout1=cfg.dropout1, dropout2=cfg.dropout2
        )
    ).to_dict()
    say(speed.line())
    if launch_rank() == 0:
        if resume_from is None:
            for stale in (ckpt_dir, cfg.out / run_dir.LOGS_DIR, cfg.out / "sample_audit"):
                shutil.rmtree(stale, ignore_errors=True)  # a fresh run must not mix with an old one
        cfg.out.mkdir(parents=True, exist_ok=True)
        data.spec.save(cfg.out / run_dir.FEATURE_SPEC)

    throughput = TrainThroughput()
    best = ModelCheckpoint(
        dirpath=ckpt_dir,
        filename="best",
        monitor="val_auc",
        mode="max",
        save_top_k=1,
        save_last=True,
        auto_insert_metric_name=False,
    )
    extra: list[L.Callback] = [SampleAudit(cfg.out / "sample_audit")] if cfg.sample_audit else []
    trainer = L.Trainer(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy=build_strategy(cfg.strategy, cfg.accelerator, cfg.world_size, cfg.ddp_timeout),
        precision=speed.precision,  # type: ignore[arg-type]
        max_epochs=cfg.max_epochs,
        callbacks=[
            best,
            EarlyStopping(monitor="val_auc", mode="max", patience=cfg.patience),
            throughput,
            *speed_callbacks,
            *extra,
            *callbacks,
        ],
        logger=CSVLogger(cfg.out, name=run_dir.LOGS_DIR, version=""),
        enable_progress_bar=cfg.progress_bar,
        num_sanity_val_steps=0,
        log_every_n_steps=50,
        deterministic=cfg.accelerator == "cpu",
        default_root_dir=cfg.out,
    )
    module = CTRModule(
        model_cfg, cfg.lr, cfg.weight_decay, speed.adam_impl, speed.fast_dropout, cfg.negative_sample_rate
    )
    if warm is not None:
        warm.apply(module.net)
    datamodule = CTRDataModule(data, cfg.batch_size, cfg.seed, buffer_rows=cfg.shuffle_buffer)
    with warnings.catch_warnings():
        # Batches come from memory or from a prefetching thread; worker processes would only add IPC copies.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*IterableDataset. has .__len__. defined.*")
        warnings.filterwarnings(
            "ignore", message=".*LeafSpec.*is deprecated.*"
        )  # inside Lightning 2.6 + torch 2.13
        t_fit = time.perf_counter()
        with explain_rendezvous_failures(cfg.ddp_timeout, cfg.world_size > 1), trace_stage("fit"):
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
        fit_seconds = time.perf_counter() - t_fit
    if not trainer.is_global_zero:
        _leave_process_group()
        return None
    with trace_stage("evaluate"):
        metrics = _final_metrics(cfg, data, trainer, throughput, best)
    metrics["speed"] = speed.to_dict()
    for governor in speed_callbacks:
        metrics["speed"]["thread_governor"] = governor.summary()
    metrics |= fit_figures(data, fit_seconds, throughput.seconds)
    metrics["wall_seconds"] = round(time.perf_counter() - t_start, 2)
    # Capped samples for export: parity and the quality gate (first validation rows), drift (spread training rows).
    val_x, val_y, train_sample = samples(data, VAL_FEATURES_ROWS, TRAIN_SAMPLE_ROWS)
    np.save(cfg.out / run_dir.VAL_FEATURES, val_x)
    save_val_raw(cfg.out / run_dir.VAL_RAW, *first_val_rows(data.data, VAL_FEATURES_ROWS))
    np.save(cfg.out / run_dir.VAL_LABELS, val_y)
    np.save(cfg.out / run_dir.TRAIN_FEATURES_SAMPLE, train_sample)
    (cfg.out / run_dir.METRICS).write_text(
        json.dumps(metrics, indent=2) + "\n"
    )  # last: marks the run complete
    _print_summary(metrics)
    print(fit_line(metrics))
    _leave_process_group()
    return metrics


def _leave_process_group() -> None:
    """Destroy the DDP process group before the interpreter exits: torch tearing a live gloo group down at exit
    aborts the process now and then (`terminate called without an active exception`, exit -6 under torchrun)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _resume_checkpoint(cfg: TrainConfig, ckpt_dir: Path) -> str | None:
    if not cfg.resume:
        return None
    last = cfg.out / run_dir.LAST_CHECKPOINT
    if not last.is_file():
        raise CheckpointError(
            f"--resume needs {last}, which does not exist; run without --resume to start fresh"
        )
    hp = torch.load(last, map_location="cpu", weights_only=False).get("hyper_parameters") or {}
    rate = hp.get("negative_sample_rate", 1.0)
    if rate != cfg.negative_sample_rate:
        raise CheckpointError(
            f"{last} was trained with --negative-sample-rate {rate:g}, not {cfg.negative_sample_rate:g}; "
            "resume with the same rate or run without --resume"
        )
    return str(last)


def _final_metrics(
    cfg: TrainConfig, data: RunInputs, trainer: L.Trainer, throughput: TrainThroughput, best: ModelCheckpoint
) -> dict[str, Any]:
    """Score the best checkpoint as export will load it (via `load_net`), beside the oracle."""
    net, ckpt = load_net(best.best_model_path)
    probs, val_y, val_ids = score_val(data, net)
    oracle_auc, oracle_logloss = _oracle(cfg, val_y, val_ids)
    w = cfg.negative_sample_rate
    corrected = probs / (probs + (1 - probs) / w)  # = sigmoid(z + ln w); the identity at w = 1
    return {
        "val_auc": roc_auc(val_y, probs),
        "val_logloss": log_loss(val_y, corrected),
        "val_logloss_uncorrected": log_loss(val_y, probs),
        "negative_sample_rate": w,
        "negative_sampling": data.kept.summary() if data.kept is not None else None,
        "oracle_auc": oracle_auc,
        "oracle_logloss": oracle_logloss,
        "samples_per_sec": round(throughput.samples_per_sec, 1),
        "global_step": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "best_epoch": int(ckpt["epoch"]),
        "best_checkpoint": f"checkpoints/{Path(best.best_model_path).name}",  # relative: the run dir can move
        "train_rows": data.rows("train"),
        "train_rows_kept": data.trained_rows(),
        "val_rows": data.rows("val"),
        "skipped_bad_rows": data.report.skipped_total,
        "loader": data.loader,
        "world_size": trainer.world_size,
        "config": cfg.to_dict(),
    }


def _oracle(cfg: TrainConfig, val_y: np.ndarray, val_ids: np.ndarray) -> tuple[float | None, float | None]:
    """Ground-truth probabilities scored on this run's validation rows, when the data is one synthetic file."""
    if not isinstance(cfg.data, Path) or not cfg.data.is_file():
        return None, None
    probs_file, summary_file = oracle_paths(cfg.data)
    if probs_file.is_file():
        truth = np.load(probs_file, mmap_mode="r")
        if val_ids.size and int(val_ids.max()) < truth.shape[0]:
            p = np.asarray(truth[val_ids], dtype=np.float64)
            return roc_auc(val_y, p), log_loss(val_y, p)
    if summary_file.is_file():
        s = json.loads(summary_file.read_text())
        if s.get("val_fraction") == cfg.val_fraction and s.get("val_rows") == len(val_y):
            return s["oracle_auc"], s["oracle_logloss"]
    return None, None


def fit_figures(data: RunInputs, fit_seconds: float, train_seconds: float) -> dict[str, Any]:
    """The fit's wall time and, under negative sampling, an estimate of what every training row would take.

    The estimate scales the epochs' training time (validation excluded, `TrainThroughput`) by the rows not
    trained on; validation, which sampling does not shrink, counts as measured.
    """
    full, kept = data.rows("train"), data.trained_rows()
    estimate = fit_seconds + train_seconds * (full / max(kept, 1) - 1)
    return {
        "fit_seconds": round(fit_seconds, 2),
        "fit_train_seconds": round(train_seconds, 2),
        "fit_seconds_all_rows_estimate": round(estimate, 2) if data.kept is not None else None,
    }


def fit_line(m: dict[str, Any]) -> str:
    """The fit's time and rows; under negative sampling, the rows kept and the time saved (an estimate)."""
    s = m["negative_sampling"]
    if s is None:
        return f"fit {m['fit_seconds']:.1f}s on {m['train_rows']:,} training rows an epoch"
    saved = m["fit_seconds_all_rows_estimate"] - m["fit_seconds"]
    return (
        f"fit {m['fit_seconds']:.1f}s on {s['rows_kept']:,} of {s['train_rows']:,} training rows an epoch "
        f"(--negative-sample-rate {s['rate']:g}: all {s['positives']:,} positives, {s['negatives_kept']:,} of "
        f"{s['negatives']:,} negatives); all rows would take ~{m['fit_seconds_all_rows_estimate']:.1f}s, "
        f"~{saved:.1f}s saved (estimate: the epochs' training time scaled by rows, validation as measured)"
    )


def _print_summary(m: dict[str, Any]) -> None:
    line = f"val AUC {m['val_auc']:.4f}  logloss {m['val_logloss']:.4f}"
    if m["oracle_auc"] is not None:
        line += f"   | oracle AUC {m['oracle_auc']:.4f}  logloss {m['oracle_logloss']:.4f}   (AUC gap {m['oracle_auc'] - m['val_auc']:.4f})"
    print(line)
    print(
        f"{m['samples_per_sec']:.0f} training samples/s, {m['global_step']} optimizer steps, {m['epochs']} epochs, best epoch {m['best_epoch']}"
    )
