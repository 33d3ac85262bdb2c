"""One closed interval of the online trainer: join it, warm-start on it plus a bounded replay, gate, publish.

Training and export run in this process, through their Python entry points with typed requests
(`training.train.run_training(TrainConfig)`, `export.pipeline.export_version(ExportRequest)`, the same objects
their CLIs build from options): the imports (PyTorch, Lightning, TensorFlow) are paid once, not per interval,
and a killed trainer leaves no child that could still publish behind the restarted one's back. Export reads
the interval's held-out Parquet partition as it is, for the gate and the calibrator.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from ctr_model.calibration import MIN_CALIBRATION_ROWS
from pipelines.clicks.join import JoinReport, join_interval, partition_name, partition_rows
from pipelines.online.published import local_version, newest_version
from training.config import TrainConfig
from training.errors import TrainingError

log = logging.getLogger("pipelines.online")
STEP_OWNED = ("data", "out", "init_from", "resume")  # the TrainConfig fields each interval's run sets


@dataclass(frozen=True)
class Settings:
    """Where the trainer reads and writes, and how it trains (`train`) and gates (`max_*`, `calibration`)."""

    logs: Path
    clicks: Path
    repo: Path | str  # a local base path, or s3://BUCKET/PREFIX (pipelines/online/published.py)
    work: Path
    interval_s: float
    window_s: float
    holdout: float = 0.2
    replay: int = 2
    replay_rows: int = 50_000
    # Each interval's run: these settings with the step's data (the replay folder), run folder and warm start.
    train: TrainConfig = field(default_factory=partial(TrainConfig, max_epochs=1))
    max_auc_drop: float = 0.002
    max_ece_rise: float = 0.01
    max_calibration_gap: float = 0.05
    calibration: str = "auto"  # export's --calibration; fitted on each interval's held-out rows (see _export)
    engine: str = (
        "embedded"  # the click join: "embedded" (pipelines/clicks/join.py) or "flink" (its Flink job)
    )

    @property
    def data(self) -> Path:
        return self.work / "data"


def join(s: Settings, interval: int) -> JoinReport:
    """Join one interval into the data folder (`s.engine`: the embedded join, or the same join on Flink)."""
    start = interval * s.interval_s
    fn = join_interval
    if s.engine == "flink":  # the Flink venv runs it (pipelines/clicks/flink/engine.py); no pyflink here
        from pipelines.clicks.flink.engine import flink_join_interval

        fn = flink_join_interval
    return fn(s.logs, s.clicks, s.data, interval, start, start + s.interval_s, s.window_s, s.holdout)


def replay_parts(data: Path, interval: int, replay: int, replay_rows: int) -> list[Path]:
    """The interval's training partition and, newest first, up to `replay` earlier ones within `replay_rows` rows."""
    parts = [data / "train" / partition_name(interval)]
    budget = replay_rows
    for j in range(interval - 1, interval - 1 - replay, -1):
        part = data / "train" / partition_name(j)
        n = partition_rows(part)
        if n == 0:
            continue
        if n > budget:
            break  # the replay stays contiguous: the newest rows first, never a gap
        parts.append(part)
        budget -= n
    return [p for p in parts if p.is_file()]


def replay_folder(s: Settings, interval: int) -> Path:
    """A run's --data folder: links to the interval's training partition and its bounded replay."""
    folder = s.work / "runs" / str(interval) / "data"
    folder.mkdir(parents=True, exist_ok=True)
    for part in replay_parts(s.data, interval, s.replay, s.replay_rows):
        link = folder / part.name
        if not link.exists():
            link.symlink_to(part.resolve())
    return folder


def warm_imports() -> None:
    """Import PyTorch, Lightning and TensorFlow now, while the first interval is still open, not inside it."""
    from ctr_contract.tf_log import quiet_tensorflow_import

    with quiet_tensorflow_import():
        import tensorflow  # noqa: F401
    import export.pipeline  # noqa: F401
    import training.train  # noqa: F401


def train_and_publish(s: Settings, interval: int, version: int) -> dict[str, Any]:
    """Train on the interval (+ replay) and export as `version`; returns {'outcome': ..., details}."""
    from training.train import run_training  # heavy imports on first use

    run = s.work / "runs" / str(interval) / "run"
    base = newest_version(s.repo)
    cfg = replace(
        s.train,
        data=replay_folder(s, interval),
        out=run,
        # A bucket's version is downloaded (checked) into the work folder first.
        init_from=None if base is None else local_version(s.repo, base, s.work / "versions"),
        resume=False,
        progress_bar=False,
    )
    t0 = time.perf_counter()
    try:
        # Training's report (features, fit, val AUC) goes beside the run, not into the trainer's log.
        with (run.parent / "train.log").open("w") as out, contextlib.redirect_stdout(out):
            run_training(cfg)
    except (TrainingError, OSError) as e:  # as `python -m training` exits 1 on them, the interval fails
        if isinstance(e, OSError) and not isinstance(e, TrainingError) and e.filename is None:
            raise  # not the run's fault: the loop's (a full disk drops the interval)
        return {"outcome": "failed", "why": f"training: {e}", "train_s": round(time.perf_counter() - t0, 2)}
    train_s = time.perf_counter() - t0
    holdout = s.data / "holdout" / partition_name(interval)
    t1 = time.perf_counter()
    result = _export(run, s, version, holdout if holdout.is_file() else None)
    return {**result, "train_s": round(train_s, 2), "export_s": round(time.perf_counter() - t1, 2)}


def _export(run: Path, s: Settings, version: int, holdout: Path | None) -> dict[str, Any]:
    """Export `run` as `version` through the gate, scored on the interval's held-out partition when it has one."""
    from ctr_contract.tf_log import quiet_tensorflow_import

    with quiet_tensorflow_import():
        import tensorflow  # noqa: F401
    from export.errors import ExportError
    from export.gates.gate import GateError
    from export.pipeline import export_version
    from export.request import ExportRequest

    # The interval's own held-out rows fit the calibrator: a click rate that drifted since the replayed intervals
    # is corrected at this publish. Fewer rows than a fit needs: the run's validation rows instead.
    rows = partition_rows(holdout) if holdout is not None else 0
    fit_on_holdout = s.calibration != "none" and rows >= MIN_CALIBRATION_ROWS
    try:
        request = ExportRequest.from_run(
            run,
            repo=s.repo,
            version=version,
            max_auc_drop=s.max_auc_drop,
            max_ece_rise=s.max_ece_rise,
            max_calibration_gap=s.max_calibration_gap,
            calibration=s.calibration,
            eval_data=holdout,
            calibration_data=holdout if fit_on_holdout else None,
        )
        result = export_version(request)
    except GateError as e:
        return {"outcome": "refused", "why": str(e)}
    except ExportError as e:
        return {"outcome": "failed", "why": str(e)}
    gate = result.quality_gate or {}
    return {"outcome": "published", "version": result.version, "gate": _gate_summary(gate)}


def _gate_summary(gate: dict[str, Any]) -> dict[str, Any]:
    cand, served = gate.get("candidate") or {}, gate.get("served") or {}
    return {
        "candidate_auc": cand.get("auc"),
        "served_version": served.get("version"),
        "served_auc": served.get("auc"),
        "rows": gate.get("rows"),
    }
