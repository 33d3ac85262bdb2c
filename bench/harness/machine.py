"""What the bench ran on: CPU, cores, memory, OS and the versions of the frameworks it compares."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness.foreign_venvs import JAX, KSERVE, MLX, TORCHSERVE

PACKAGES = (
    "torch",
    "lightning",
    "tensorflow",
    "onnxruntime",
    "onnx",
    "numpy",
    "fastapi",
    "uvicorn",
)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from /proc/cpuinfo, falling back to `platform.processor()`."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: the platform module is the fallback below
    return platform.processor() or platform.machine() or "unknown"


def memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """Total memory in GiB, or None where /proc/meminfo is unavailable."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def venv_package_version(venv: Path, name: str) -> str | None:
    """The version of `name` inside another venv (KServe lives in `.venv-kserve`: its pins clash with TF)."""
    python = venv / "bin" / "python"
    if not python.is_file():
        return None
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def tool_version(tool: str) -> str | None:
    """The first line `tool --version` prints (wrk, hey), or None when the tool is absent."""
    path = shutil.which(tool)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (out.stdout or out.stderr).strip().splitlines()
    return first[0].split(" Copyright")[0] if first else path


def collect_machine() -> dict[str, Any]:
    """Describe this machine and the package versions, without importing the frameworks."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": memory_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": {
            **{name: package_version(name) for name in PACKAGES},
            **{
                f"{venv.distributions[0]} ({venv.path.name})": venv_package_version(
                    venv.path, venv.distributions[0]
                )
                for venv in (KSERVE, JAX, MLX, TORCHSERVE)
            },
        },
        "tools": {
            tool: version for tool in ("wrk", "hey") if (version := tool_version(tool)) or tool == "wrk"
        },
    }
