"""The bench's foreign frameworks, each in its own venv created on first use: JAX + Flax, MLX, TorchServe, KServe.

Their pins must never touch `.venv` (TensorFlow, the CPU torch wheel). A section's
one-time setup (`python -m bench.section_runner NAME --prepare`, bounded) creates them; the setup records each
failure in the section's workdir, and a measurement whose venv is missing puts that exact error in its row.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.harness import procs
from bench.harness.inputs import PROJECT_ROOT

SETUP_FILE = "foreign_setup.json"  # {venv name: setup error}, in the section's workdir
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class ForeignVenv:
    """One framework's private venv.

    Args:
        name: short name, e.g. "jax".
        path: the venv directory (`.venv-jax`).
        packages: what `pip install` gets, in one call.
        imports: the import statement that proves the venv works.
        distributions: whose versions the report shows beside the framework's rows.
    """

    name: str
    path: Path
    packages: tuple[str, ...]
    imports: str
    distributions: tuple[str, ...]

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def ready(self) -> bool:
        """True when the venv exists and its imports work (within 120 s)."""
        if not self.python.exists():
            return False
        try:
            check = subprocess.run([str(self.python), "-c", self.imports], capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            return False  # an environment whose imports hang is as unusable as a missing one
        return check.returncode == 0

    def ensure(self, log: Path, timeout_s: float = INSTALL_TIMEOUT_S) -> Path:
        """Create the venv and install its packages unless it is ready; return its python.

        Raises:
            bench.harness.procs.StepError: venv creation or pip failed or timed out (the message holds pip's log tail).
        """
        if not self.ready():
            procs.run_bounded(["python3", "-m", "venv", str(self.path)], timeout_s=120, log=log)
            pip = [str(self.path / "bin" / "pip"), "install", "-q", *self.packages]
            procs.run_bounded(pip, timeout_s=timeout_s, log=log)
            if not self.ready():
                raise procs.StepError(
                    f"{self.path}: installed, but `{self.imports}` fails\n{procs.log_tail(log)}"
                )
        return self.python

    def versions(self) -> dict[str, str]:
        """Installed versions of `distributions` inside the venv; {} when it is absent."""
        if not self.python.exists():
            return {}
        code = f"import importlib.metadata as m, json; print(json.dumps({{d: m.version(d) for d in {list(self.distributions)!r}}}))"
        try:
            out = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return {}
        return json.loads(out.stdout) if out.returncode == 0 else {}


JAX = ForeignVenv(
    "jax",
    PROJECT_ROOT / ".venv-jax",
    ("jax", "flax", "optax", "numpy"),
    "import jax, flax, optax",
    ("jax", "flax", "optax"),
)
MLX = ForeignVenv(
    "mlx",
    PROJECT_ROOT / ".venv-mlx",
    ("mlx[cpu]", "numpy"),
    "import mlx.core, mlx.nn, mlx.optimizers",
    ("mlx",),
)
# torch==2.13.0 pinned as in the Makefile: a bare `torch` would pull a multi-GB CUDA build.
TORCHSERVE = ForeignVenv(
    "torchserve",
    PROJECT_ROOT / ".venv-torchserve",
    ("torch==2.13.0", "torchserve", "torch-model-archiver", "numpy", "pyyaml"),
    "import ts, model_archiver, torch, yaml",
    ("torchserve", "torch-model-archiver", "torch"),
)
# Serving's KServe ModelServer: the serving section creates it on first use and raises when it cannot.
KSERVE = ForeignVenv(
    "kserve",
    PROJECT_ROOT / ".venv-kserve",
    ("kserve", "onnxruntime"),
    "import kserve, onnxruntime",
    ("kserve",),
)


def prepare(venvs: tuple[ForeignVenv, ...], workdir: Path) -> list[str]:
    """Ensure each venv, recording each failure in `workdir/foreign_setup.json`; returns one line per venv."""
    workdir.mkdir(parents=True, exist_ok=True)
    errors: dict[str, str] = {}
    lines = []
    for venv in venvs:
        try:
            lines.append(f"{venv.name}: ready at {venv.ensure(workdir / f'{venv.name}_install.log')}")
        except procs.StepError as e:
            errors[venv.name] = f"could not build {venv.path.name}: {e}"
            lines.append(f"{venv.name}: {errors[venv.name]}")
        (workdir / SETUP_FILE).write_text(json.dumps(errors, indent=2))
    return lines


def unavailable_reason(venv: ForeignVenv, workdir: Path) -> str | None:
    """None when the venv works; else why not: the setup's recorded error, or that no setup created it."""
    if venv.ready():
        return None
    setup = workdir / SETUP_FILE
    recorded = json.loads(setup.read_text()).get(venv.name) if setup.is_file() else None
    if recorded:
        return str(recorded)
    if venv.path.exists():
        return f"{venv.path.name} exists but `{venv.imports}` fails in it; delete it and rerun the quick or full bench"
    return f"{venv.path.name} is absent; `make bench BENCH=quick` (or full) creates it (the tiny mode never installs)"
