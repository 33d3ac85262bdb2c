"""The machine description in every report: CPU model, memory, package and tool versions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from bench.harness.machine import cpu_model, memory_gib, package_version, venv_package_version
from tests.helpers import REPO_ROOT


def test_cpu_model_is_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n"
    )

    assert cpu_model(cpuinfo) == "AMD EPYC 7B13 64-Core Processor"


def test_memory_is_total_gib_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemFree:        1000 kB\n")

    assert memory_gib(meminfo) == 24.0
    assert memory_gib(tmp_path / "absent") is None


def test_machine_reports_the_versions_the_frameworks_report_without_importing_them() -> None:
    code = (
        "import json, sys; from bench.harness.machine import collect_machine; m = collect_machine(); "
        "print(json.dumps([m, sorted(x for x in ('torch', 'tensorflow', 'lightning') if x in sys.modules)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    machine, imported = json.loads(out.stdout)
    assert imported == []  # the report is written before the frameworks load, and must not load them
    assert machine["packages"]["torch"] == torch.__version__  # what the imported framework says of itself
    assert machine["packages"]["onnxruntime"] == onnxruntime.__version__
    assert 1 <= machine["usable_cores"] <= machine["logical_cores"]
    assert package_version("no-such-distribution-xyz") is None


def test_another_venvs_package_versions_are_read_with_its_own_python(tmp_path: Path) -> None:
    assert venv_package_version(Path(sys.prefix), "numpy") == np.__version__  # this venv, as another would be
    assert venv_package_version(tmp_path, "numpy") is None  # no bin/python there
