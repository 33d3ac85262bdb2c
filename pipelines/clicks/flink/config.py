"""The Flink click join's configuration: its sources, intervals, output, parallelism and checkpoints.

A job reads one JSON object (`JobConfig.to_dict`); the sources are configuration, so the filesystem folders
used here and Kafka topics in production are the same job:

    {"requests": {"connector": "filesystem", "path": "/logs", "monitor_interval_s": 1.0},
     "clicks":   {"connector": "kafka", "topic": "clicks", "bootstrap_servers": "kafka:9092",
                  "group_id": "ctr-join"}, ...}

A filesystem source without `monitor_interval_s` is bounded (the files there now, then the job ends); with it
the folder is monitored for new files (a file is read once, when it is found: finished files go there, e.g.
renamed in). A Kafka source (the `flink-sql-connector-kafka` jar on the job's class path) reads one topic,
records as lines; it is written here and in k8s/, never run in this repository's tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.clicks.flink.logic import Intervals


@dataclass
class JobConfig:
    """What one Flink join job does (see the module docstring for the source forms)."""

    requests: dict[str, Any]
    clicks: dict[str, Any]
    out: str
    reports: str
    window_s: float
    holdout: float
    interval_s: float = 3600.0
    explicit: list[list[float]] = field(default_factory=list)  # [[n, start, end], ...]: only these
    parallelism: int = 1  # 0: the cluster's default (a FlinkDeployment's job.parallelism)
    lag_s: float = 5.0  # continuous sources: the watermark's bounded out-of-orderness
    idle_s: float = 5.0  # continuous sources: a quiet subtask holds the watermark back no longer
    checkpoint_dir: str | None = None
    checkpoint_interval_s: float = 10.0
    restore: str | None = None  # a retained checkpoint (chk-N folder) to start from
    python: str | None = None  # the Python of the Flink venv, for the workers
    execution_mode: str = "thread"  # Python functions in the TaskManager's JVM (pemja), or "process"
    name: str = "ctr-click-join"
    settings: dict[str, str] = field(default_factory=dict)  # more Flink configuration, verbatim

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobConfig:
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def continuous(self) -> bool:
        return any(
            s.get("connector") == "kafka" or s.get("monitor_interval_s") for s in (self.requests, self.clicks)
        )

    def intervals(self) -> Intervals:
        explicit = tuple((int(n), float(s), float(e)) for n, s, e in self.explicit)
        return Intervals(self.interval_s, self.window_s, explicit)


def flink_settings(cfg: JobConfig) -> dict[str, str]:
    """The Flink configuration of a job: its Python, checkpoints and restore point."""
    out = {"python.execution-mode": cfg.execution_mode}
    if cfg.python:
        out |= {"python.executable": cfg.python, "python.client.executable": cfg.python}
    if cfg.checkpoint_dir:
        out |= {
            "execution.checkpointing.interval": f"{int(cfg.checkpoint_interval_s * 1000)}ms",
            "execution.checkpointing.dir": "file://" + cfg.checkpoint_dir,
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            "execution.checkpointing.num-retained": "3",
            "state.backend.type": "hashmap",
        }
    if cfg.restore:
        out["execution.state-recovery.path"] = "file://" + cfg.restore
    return out | cfg.settings


COLUMNS = "line BYTES"
KAFKA_MTIME_MS = 4_102_444_800_000  # 2100-01-01: a partition is never skipped as too old
FILE_METADATA = (
    "path STRING NOT NULL METADATA FROM 'file.path' VIRTUAL, "
    "mtime TIMESTAMP_LTZ(3) NOT NULL METADATA FROM 'file.modification-time' VIRTUAL, "
    "size BIGINT NOT NULL METADATA FROM 'file.size' VIRTUAL"
)


def _quote(v: Any) -> str:
    return "'" + str(v).replace("'", "''") + "'"


def source_ddl(cfg: JobConfig, stream: str) -> tuple[str, str]:
    """(CREATE TABLE statement of the stream's source `<stream>_src`, the root its paths are relative to)."""
    src = getattr(cfg, stream)
    if src.get("connector") == "filesystem":
        opts = {"connector": "filesystem", "path": src["path"], "format": "raw"}
        if src.get("monitor_interval_s"):
            opts["source.monitor-interval"] = f"{int(src['monitor_interval_s'] * 1000)}ms"
        with_ = ", ".join(f"{_quote(k)} = {_quote(v)}" for k, v in opts.items())
        return f"CREATE TABLE {stream}_src ({COLUMNS}, {FILE_METADATA}) WITH ({with_})", src["path"]
    if src.get("connector") == "kafka":
        # A partition stands in for a file, its offsets for line numbers (always complete, never skipped).
        name = "requests-" if stream == "requests" else ""
        opts = {
            "connector": "kafka",
            "topic": src["topic"],
            "properties.bootstrap.servers": src["bootstrap_servers"],
            "properties.group.id": src.get("group_id", "ctr-join"),
            "scan.startup.mode": src.get("startup_mode", "group-offsets"),
            "properties.auto.offset.reset": "earliest",
            "format": "raw",
        }
        with_ = ", ".join(f"{_quote(k)} = {_quote(v)}" for k, v in opts.items())
        columns = (
            f"{COLUMNS}, part INT NOT NULL METADATA FROM 'partition' VIRTUAL, "
            f"path AS CONCAT('kafka/{name}', CAST(part AS STRING), '.jsonl'), "
            f"mtime AS TO_TIMESTAMP_LTZ({KAFKA_MTIME_MS}, 3), size AS CAST({2**62} AS BIGINT)"
        )
        return f"CREATE TABLE {stream}_src ({columns}) WITH ({with_})", "kafka"
    raise ValueError(f"{stream}: unknown connector {src.get('connector')!r} (filesystem or kafka)")
