"""The manifest format has one home (ctr_contract.manifest): export writes it, serving checks against it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ctr_contract.manifest import (
    FILES_KEY,
    MANIFEST_KEYS,
    file_hashes,
    is_listed_path,
    is_sha256_hex,
    sha256_file,
)
from ctr_contract.repository import MANIFEST_PATH
from export.publish.manifest import build_manifest
from serving.repository.manifest_check import HashMismatch, VersionRejected, listed_files, stamp, verify


def _version(tmp_path: Path) -> Path:
    """A version folder with two files and a manifest listing them (written by the contract's own helper)."""
    version = tmp_path / "1"
    (version / "assets.extra").mkdir(parents=True)
    (version / "model.onnx").write_bytes(b"\x08\x07onnx")
    (version / "assets.extra" / "feature_spec.json").write_text("{}")
    (version / MANIFEST_PATH).write_text(json.dumps({FILES_KEY: file_hashes(version)}))
    return version


def test_sha256_file_is_hashlib_over_the_bytes_of_a_file_larger_than_one_chunk(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = bytes(range(256)) * ((3 << 20) // 256 + 7)  # 3 MiB and a bit: several 1 MiB chunks
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_file_hashes_lists_every_file_but_the_manifest_by_posix_path(tmp_path: Path) -> None:
    version = _version(tmp_path)
    assert file_hashes(version) == {
        "assets.extra/feature_spec.json": hashlib.sha256(b"{}").hexdigest(),
        "model.onnx": hashlib.sha256(b"\x08\x07onnx").hexdigest(),
    }


def test_serving_accepts_the_files_map_the_contract_writes_and_names_a_changed_file(tmp_path: Path) -> None:
    version = _version(tmp_path)
    verify(version, stamp(version))  # complete: returns
    (version / "model.onnx").write_bytes(b"\x08\x07ONNX")
    with pytest.raises(HashMismatch) as caught:
        verify(version, stamp(version))
    actual, listed = (hashlib.sha256(b).hexdigest() for b in (b"\x08\x07ONNX", b"\x08\x07onnx"))
    assert str(caught.value) == f"model.onnx has sha256 {actual}, {MANIFEST_PATH} lists {listed}"


@pytest.mark.parametrize("rel", ["", "/etc/passwd", "../2/model.onnx", "a/../../b", MANIFEST_PATH])
def test_listed_paths_stay_inside_the_version_and_leave_out_the_manifest(rel: str) -> None:
    assert not is_listed_path(rel)


def test_serving_rejects_a_listed_path_outside_the_version_with_the_contract_rule(tmp_path: Path) -> None:
    version = _version(tmp_path)
    (version / MANIFEST_PATH).write_text('{"files": {"../2/model.onnx": "' + "0" * 64 + '"}}')
    with pytest.raises(VersionRejected, match=r"lists '\.\./2/model\.onnx', not a file inside the version"):
        listed_files(version)


@pytest.mark.parametrize(
    ("digest", "valid"),
    [("0" * 64, True), ("a" * 64, True), ("A" * 64, False), ("0" * 63, False), (None, False), (7, False)],
)
def test_a_digest_is_64_lowercase_hex_characters(digest: object, valid: bool) -> None:
    assert is_sha256_hex(digest) is valid


def test_export_writes_the_contract_keys_in_order(tmp_path: Path) -> None:
    checkpoint = tmp_path / "best.ckpt"
    checkpoint.write_bytes(b"weights")
    manifest = build_manifest(
        version=1,
        checkpoint=checkpoint,
        ckpt={},
        metrics=None,
        io={},
        opset=18,
        target={},
        patches=[],
        parity={},
        files={"model.onnx": "0" * 64},
        export_seconds=1.0,
    )
    assert tuple(manifest) == MANIFEST_KEYS
    assert manifest[FILES_KEY] == {"model.onnx": "0" * 64}
    assert manifest["source_checkpoint"]["sha256"] == hashlib.sha256(b"weights").hexdigest()
