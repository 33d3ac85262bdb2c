"""One closed interval of the online trainer: join it, warm-start on it plus a bounded replay, gate, publish.

Training and export run in this process (`training.cli.main`, `export.pipeline.export_version`): the imports
(PyTorch, Lightning, TensorFlow) are paid once, not per interval, and a killed trainer leaves no child that
could still publish behind the restarted one's back.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_model.calibration import MIN_CALIBRATION_ROWS
from pipelines.clicks.join import JoinReport, join_interval, partition_name, partition_rows
from pipelines.online.published import local_version, newest_version

log = logging.getLogger("pipelines.online")


@dataclass(frozen=True)
class Settings:
    """Where the trainer reads and writes, and how it trains."""

    logs: Path
    clicks: Path
    repo: Path | str  # a local base path, or s3://BUCKET/PREFIX (pipelines/online/published.py)
    work: Path
    interval_s: float
    window_s: float
    holdout: float = 0.2
    replay: int = 2
    replay_rows: int = 50_000
    epochs: int = 1
    train_args: tuple[str, ...] = ()
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
    from training.cli import main as train_main  # heavy imports on first use

    run = s.work / "runs" / str(interval) / "run"
    base = newest_version(s.repo)
    argv = ["--data", str(replay_folder(s, interval)), "--out", str(run), "--no-progress-bar"]
    argv += ["--max-epochs", str(s.epochs), *s.train_args]
    if base is not None:  # a bucket's version is downloaded (checked) into the work folder first
        argv += ["--init-from", str(local_version(s.repo, base, s.work / "versions"))]
    t0 = time.perf_counter()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train_main(argv)
    train_s = time.perf_counter() - t0
    if code != 0:
        return {"outcome": "failed", "why": f"training exited {code}", "train_s": train_s}
    holdout = s.data / "holdout" / partition_name(interval)
    t1 = time.perf_counter()
    eval_file = criteo_text(holdout, run.parent / "eval.txt") if holdout.is_file() else None
    result = _export(run, s, version, eval_file)
    return {**result, "train_s": round(train_s, 2), "export_s": round(time.perf_counter() - t1, 2)}


def criteo_text(partition: Path, out: Path) -> Path:
    """A partition's rows as a Kaggle train.txt file: the form `python -m export --eval-data` reads."""
    table = pq.read_table(partition, columns=[LABEL, *NUMERIC_FIELDS, *CATEGORICAL_FIELDS])
    table = table.set_column(0, LABEL, table.column(LABEL).cast(pa.int64()))
    for f in NUMERIC_FIELDS:
        table = table.set_column(table.schema.get_field_index(f), f, table.column(f).cast(pa.int64()))
    opts = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    pacsv.write_csv(table, out, write_options=opts)
    return out


def _export(run: Path, s: Settings, version: int, eval_data: Path | None) -> dict[str, Any]:
    from ctr_contract.tf_log import quiet_tensorflow_import

    with quiet_tensorflow_import():
        import tensorflow  # noqa: F401
    from export.__main__ import build_parser, request_from_args
    from export.errors import ExportError
    from export.gates.gate import GateError
    from export.pipeline import export_version

    argv = ["--run", str(run), "--repo", str(s.repo), "--version", str(version)]
    argv += ["--max-auc-drop", str(s.max_auc_drop), "--max-ece-rise", str(s.max_ece_rise)]
    argv += ["--max-calibration-gap", str(s.max_calibration_gap), "--calibration", s.calibration]
    if eval_data is not None:
        argv += ["--eval-data", str(eval_data)]
        if s.calibration != "none" and _rows(eval_data) >= MIN_CALIBRATION_ROWS:
            # The interval's own held-out rows: a click rate that drifted since the replayed intervals is
            # corrected at this publish. Fewer rows than a fit needs: the run's validation rows instead.
            argv += ["--calibration-data", str(eval_data)]
    try:
        result = export_version(request_from_args(build_parser().parse_args(argv)))
    except GateError as e:
        return {"outcome": "refused", "why": str(e)}
    except ExportError as e:
        return {"outcome": "failed", "why": str(e)}
    gate = result.quality_gate or {}
    return {"outcome": "published", "version": result.version, "gate": _gate_summary(gate)}


def _rows(criteo_file: Path) -> int:
    with criteo_file.open("rb") as f:
        return sum(1 for _ in f)


def _gate_summary(gate: dict[str, Any]) -> dict[str, Any]:
    cand, served = gate.get("candidate") or {}, gate.get("served") or {}
    return {
        "candidate_auc": cand.get("auc"),
        "served_version": served.get("version"),
        "served_auc": served.get("auc"),
        "rows": gate.get("rows"),
    }
