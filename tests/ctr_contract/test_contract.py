"""The contract between the stages: one version-folder rule, and every stage reading the repository by it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ctr_contract
from ctr_contract.repository import MAX_VERSION, parse_version_dir, version_dirs
from export.publish.repository import ModelRepository
from serving.repository.manager import versions_on_disk
from serving.repository.policy import VersionPolicy
from tests.helpers import REPO_ROOT

# Folder names that are not versions, each for its own reason.
NOT_VERSIONS = [
    "0",  # versions start at 1
    "01",  # not canonical: it would be the same version as `1`
    "007",
    "+1",
    "-1",
    " 1",
    "1 ",
    "1.0",
    "1e3",
    "²",  # a Unicode digit: str.isdigit() accepts it, int() does not
    "١",  # Arabic-Indic one: int() accepts it, TF Serving does not
    "",
    ".tmp-3-1234",  # export's staging folder
    "latest",
    str(MAX_VERSION + 1),  # does not fit TF Serving's int64
    "99999999999999999999",
]


@pytest.mark.parametrize(
    ("name", "version"), [("1", 1), ("7", 7), ("10", 10), ("4096", 4096), (str(MAX_VERSION), 2**63 - 1)]
)
def test_parse_version_dir_accepts_canonical_positive_int64(name: str, version: int) -> None:
    assert parse_version_dir(name) == version


@pytest.mark.parametrize("name", NOT_VERSIONS)
def test_parse_version_dir_rejects(name: str) -> None:
    assert parse_version_dir(name) is None


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A model base path holding versions 1, 3 and 12, plus every kind of folder that is not a version."""
    for name in ("1", "3", "12", *[n for n in NOT_VERSIONS if n and "/" not in n]):
        (tmp_path / name).mkdir()
    (tmp_path / "5").write_text("a file named like a version is not one")
    return tmp_path


def test_version_dirs_lists_only_version_folders(base: Path) -> None:
    assert version_dirs(base) == {1: base / "1", 3: base / "3", 12: base / "12"}
    assert version_dirs(base / "absent") == {}


def test_every_stage_reads_the_repository_by_the_same_rule(base: Path) -> None:
    assert sorted(versions_on_disk(base)) == [1, 3, 12]  # serving
    assert ModelRepository(base).versions() == [1, 3, 12]  # export
    assert ModelRepository(base).choose_version(None) == 13
    # bench reads it by the same rule too: tests/bench/harness/test_bench_version_rule.py


def test_version_flags_follow_the_version_folder_rule() -> None:
    assert VersionPolicy.parse(f"specific:3,1,{MAX_VERSION}").versions == (1, 3, MAX_VERSION)
    for text in ("specific:01", "specific:0", f"specific:{MAX_VERSION + 1}", "latest:²"):
        with pytest.raises(ValueError, match="bad version policy"):
            VersionPolicy.parse(text)


def test_contract_names() -> None:
    """The literal values other tools (TF Serving, Triton, users' clients) depend on."""
    assert (ctr_contract.DEFAULT_SIGNATURE, ctr_contract.RAW_SIGNATURE) == ("serving_default", "raw")
    assert (ctr_contract.INPUT_NAME, ctr_contract.OUTPUT_NAME) == ("features", "ctr")
    assert ctr_contract.WARMUP_PATH == "assets.extra/tf_serving_warmup_requests"
    assert ctr_contract.MANIFEST_PATH == "assets.extra/manifest.json"
    assert ctr_contract.BEST_CHECKPOINT == "checkpoints/best.ckpt"
    assert ctr_contract.FIELDS[:3] == ("label", "I1", "I2") and ctr_contract.FIELDS[-1] == "C26"
    assert ctr_contract.N_FIELDS == 40 and len(ctr_contract.RAW_FIELDS) == 39


def test_contract_imports_only_the_standard_library() -> None:
    """Clients and the serving image import the contract: it must not pull numpy, torch or TensorFlow."""
    code = "import sys, ctr_contract; print(sorted(m for m in ('numpy', 'torch', 'tensorflow') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert out.stdout.strip() == "[]"
