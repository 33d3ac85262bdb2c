"""bench reads a model repository by the contract's version-folder rule, as every stage does."""

from __future__ import annotations

from pathlib import Path

from bench.harness.inputs import latest_version
from bench.harness.servers import base_path_of
from ctr_contract.repository import version_dirs


def test_bench_reads_the_repository_by_the_version_folder_rule(tmp_path: Path) -> None:
    for name in ("1", "3", "12", "tmp-13", ".14", "007", "x"):
        (tmp_path / name).mkdir()
    (tmp_path / "5").write_text("a file named like a version is not one")
    assert sorted(version_dirs(tmp_path)) == [1, 3, 12]
    assert latest_version(tmp_path) == tmp_path / "12"
    assert base_path_of(tmp_path) == tmp_path
