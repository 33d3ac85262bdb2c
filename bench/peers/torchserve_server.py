"""TorchServe as a serving peer: archive the exported TorchScript `model.pt`, configure, and build its command.

TorchServe (Java frontend + one Python worker, in `.venv-torchserve`) serves `bench/peers/torchserve_handler.py` on
its own predictions API, POST /predictions/ctr, with the same TF-Serving-style body as our server. Every port is
a free one on 127.0.0.1 (its gRPC ports too), token auth is off, and TMPDIR points into the workdir, because the
launcher keeps a global pid file there and refuses to start a second server beside another one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness import procs
from bench.harness.foreign_venvs import TORCHSERVE

HANDLER = Path(__file__).with_name("torchserve_handler.py")  # runs inside TorchServe's worker, by path
PREDICT_PATH = "/predictions/ctr"
REQUEST_API = "TorchServe predictions API (POST /predictions/ctr), TF-Serving-style body via a custom handler"
# The JVM's heap cap: TorchServe's default (1/4 of RAM) lets one bench server grow past the machine's share.
JVM_ARGS = "-Xmx1g -XX:+UseContainerSupport"


@dataclass(frozen=True)
class TorchServeLaunch:
    """What `serving_load` needs to run TorchServe: the command, its environment and where it listens."""

    cmd: list[str]
    env: dict[str, str]
    cwd: Path
    port: int
    path: str = PREDICT_PATH


def archive(version_dir: Path, store: Path, log: Path) -> Path:
    """Pack model.pt and the handler into `store/ctr.mar` with torch-model-archiver (bounded to 300 s)."""
    model = version_dir / "model.pt"
    if not model.is_file():
        raise FileNotFoundError(f"{version_dir} has no model.pt; export with --torchscript (the default)")
    store.mkdir(parents=True, exist_ok=True)
    archiver = TORCHSERVE.path / "bin" / "torch-model-archiver"
    cmd = [
        str(archiver),
        "--model-name",
        "ctr",
        "--version",
        version_dir.name,
        "--serialized-file",
        str(model),
        "--handler",
        str(HANDLER),
        "--export-path",
        str(store),
        "--force",
    ]
    procs.run_bounded(cmd, timeout_s=300, log=log)
    return store / "ctr.mar"


def config_text(store: Path, ports: dict[str, int]) -> str:
    """config.properties: 127.0.0.1 only, 1 worker, no system-metrics sampler, the JVM heap cap."""
    return "\n".join(
        [
            f"inference_address=http://127.0.0.1:{ports['inference']}",
            f"management_address=http://127.0.0.1:{ports['management']}",
            f"metrics_address=http://127.0.0.1:{ports['metrics']}",
            f"grpc_inference_port={ports['grpc_inference']}",
            f"grpc_management_port={ports['grpc_management']}",
            f"model_store={store}",
            "default_workers_per_model=1",
            "disable_system_metrics=true",
            "install_py_dep_per_model=false",
            "job_queue_size=1000",
            f"vmargs={JVM_ARGS}",
            "",
        ]
    )


def launch(version_dir: Path, workdir: Path, free_port: Callable[[], int]) -> TorchServeLaunch:
    """Archive the model, write the config and return the foreground `torchserve --start` command.

    Args:
        version_dir: a published version folder holding model.pt.
        workdir: gets model-store/, config.properties, logs/ and tmp/.
        free_port: a callable returning a free 127.0.0.1 port (serving_load.free_port).
    """
    ts_dir = workdir / "torchserve"
    store = ts_dir / "model-store"
    archive(version_dir, store, ts_dir / "archive.log")
    ports = {
        k: free_port() for k in ("inference", "management", "metrics", "grpc_inference", "grpc_management")
    }
    config = ts_dir / "config.properties"
    config.write_text(config_text(store, ports))
    (ts_dir / "tmp").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "TMPDIR": str(ts_dir / "tmp"),
        "LOG_LOCATION": str(ts_dir / "logs"),
        "METRICS_LOCATION": str(ts_dir / "logs"),
        "PATH": f"{TORCHSERVE.path / 'bin'}:{os.environ.get('PATH', '')}",
    }
    cmd = [
        str(TORCHSERVE.path / "bin" / "torchserve"),
        "--start",
        "--foreground",
        "--ncs",
        "--disable-token-auth",
        "--ts-config",
        str(config),
        "--model-store",
        str(store),
        "--models",
        "ctr=ctr.mar",
    ]
    return TorchServeLaunch(cmd=cmd, env=env, cwd=ts_dir, port=ports["inference"])
