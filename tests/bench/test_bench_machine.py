"""The machine description in every report: CPU model, memory, package and tool versions."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from bench.machine import collect_machine, cpu_model, memory_gib, package_version


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


def test_machine_lists_the_compared_frameworks_versions() -> None:
    machine = collect_machine()

    assert machine["packages"]["torch"] == metadata.version("torch")
    assert machine["packages"]["onnxruntime"] == metadata.version("onnxruntime")
    assert machine["packages"]["tensorflow"] == metadata.version("tensorflow")
    assert machine["packages"]["lightning"] == metadata.version("lightning")
    assert machine["usable_cores"] >= 1
    assert package_version("no-such-distribution-xyz") is None
