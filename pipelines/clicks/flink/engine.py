"""Running the Flink click join from the main venv: the job runs in the Flink venv's Python, a subprocess.

`flink_join_interval` has `join_interval`'s signature (pipelines/clicks/join.py) and result: the online trainer
(`--engine flink`) and live evaluation call either. It runs the job bounded over the folders as they are now,
for that one interval, in a local MiniCluster. `start_job` runs a job of any configuration (continuous,
checkpointed) and returns the process.

The Flink venv is `make flink-venv`'s `.venv-flink` (apache-flink and Java 17), or $CTR_FLINK_PYTHON.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from pipelines.clicks.flink.config import JobConfig
from pipelines.clicks.join import JoinReport

REPO_ROOT = Path(__file__).resolve().parents[3]
FLINK_VENV = REPO_ROOT / ".venv-flink"


class FlinkUnavailable(RuntimeError):
    """No Flink venv to run the job in."""


def flink_python() -> Path | None:
    """The Flink venv's Python, or None when there is none."""
    env = os.environ.get("CTR_FLINK_PYTHON")
    path = Path(env) if env else FLINK_VENV / "bin" / "python"
    return path if path.is_file() else None


def _python() -> Path:
    python = flink_python()
    if python is None:
        raise FlinkUnavailable(
            f"no Flink venv at {FLINK_VENV} (make flink-venv installs apache-flink and Java 17), "
            "and $CTR_FLINK_PYTHON is not set"
        )
    return python


def start_job(cfg: JobConfig, workdir: Path, log: Path | None = None) -> subprocess.Popen[bytes]:
    """Start the job of `cfg` (its config in WORKDIR/job.json); its own process group, so it can be killed whole."""
    python = _python()
    cfg.python = cfg.python or str(python)
    # The job runs from the repository's root: the caller's relative paths, made absolute here.
    for src in (cfg.requests, cfg.clicks):
        if src.get("connector") == "filesystem":
            src["path"] = os.path.abspath(src["path"])
    cfg.out, cfg.reports = os.path.abspath(cfg.out), os.path.abspath(cfg.reports)
    if cfg.checkpoint_dir:
        cfg.checkpoint_dir = os.path.abspath(cfg.checkpoint_dir)
    if cfg.restore:
        cfg.restore = os.path.abspath(cfg.restore)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    java17 = sorted(Path("/usr/lib/jvm").glob("java-17-openjdk-*/bin/java"))
    if "JAVA_HOME" not in env and java17:  # Flink 2.3 runs on Java 11, 17 or 21: 17 when there are several
        env["JAVA_HOME"] = str(java17[0].parents[1])
    sink = (log or workdir / "job.log").open("ab")
    return subprocess.Popen(
        [str(python), "-m", "pipelines.clicks.flink.job", "--config", str(workdir / "job.json")],
        cwd=REPO_ROOT,
        env=env,
        stdout=sink,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def run_job(cfg: JobConfig, workdir: Path, timeout_s: float = 600.0) -> None:
    """Run a bounded job to its end; raises RuntimeError (with the log's tail) when it fails."""
    proc = start_job(cfg, workdir)
    try:
        rc = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        rc = -9
    if rc != 0:
        tail = (workdir / "job.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the Flink join failed (exit {rc}):\n{tail}")


def read_report(reports: Path, interval: int, start: float, end: float) -> JoinReport:
    """An interval's report as the job wrote it (an empty one when it had no events at all)."""
    from pipelines.clicks.flink.output import report_path

    path = report_path(reports, interval)
    if not path.is_file():
        return JoinReport(interval, start, end)
    return JoinReport(**json.loads(path.read_text()))


def flink_join_interval(
    logs: Path,
    clicks: Path,
    out: Path,
    interval: int,
    start: float,
    end: float,
    window_s: float,
    holdout: float,
    parallelism: int = 1,
) -> JoinReport:
    """`join_interval` on Flink: requests logged in [start, end) with their clicks -> OUT/train, OUT/holdout."""
    with tempfile.TemporaryDirectory(prefix="flink-join-") as tmp:
        work = Path(tmp)
        (work / "none").mkdir()  # a folder that does not exist yet holds no events: read an empty one

        def folder(p: Path) -> str:
            return str(Path(p).resolve() if Path(p).is_dir() else work / "none")

        cfg = JobConfig(
            requests={"connector": "filesystem", "path": folder(logs)},
            clicks={"connector": "filesystem", "path": folder(clicks)},
            out=str(Path(out).resolve()),
            reports=str(work / "reports"),
            window_s=window_s,
            holdout=holdout,
            interval_s=end - start,
            explicit=[[interval, start, end]],
            parallelism=parallelism,
        )
        run_job(cfg, work)
        return read_report(work / "reports", interval, start, end)
