"""ctr_store against a real SeaweedFS: listing, a version's upload and checked download, claims, faults."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ctr_contract.manifest import file_hashes
from ctr_contract.repository import MANIFEST_PATH
from ctr_store.config import StoreConfig
from ctr_store.errors import DENIED, HASH_MISMATCH, UNREACHABLE, StoreError
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import (
    VersionIncomplete,
    claim_version,
    delete_version,
    download_version,
    list_versions,
    upload_version,
)


def make_version(root: Path, payload: bytes = b"onnx bytes") -> Path:
    v = root / "v"
    (v / "assets.extra").mkdir(parents=True)
    (v / "model.onnx").write_bytes(payload)
    (v / "assets.extra" / "feature_spec.json").write_text("{}")
    (v / MANIFEST_PATH).write_text(json.dumps({"version": 1, "files": file_hashes(v)}))
    return v


@pytest.fixture
def store(s3_env: dict[str, str]) -> ObjectStore:
    return ObjectStore(StoreConfig.from_env())


def test_bucket_path_parse() -> None:
    assert BucketPath.parse("s3://models/prod/ctr/") == BucketPath("models", "prod/ctr")
    assert BucketPath.parse("s3://models/prod/ctr").key("3", "model.onnx") == "prod/ctr/3/model.onnx"
    assert str(BucketPath.parse("s3://models")) == "s3://models"
    with pytest.raises(ValueError, match="names no bucket"):
        BucketPath.parse("s3:///ctr")


def test_config_reads_tf_serving_variables() -> None:
    c = StoreConfig.from_env({"S3_ENDPOINT": "minio:9000", "S3_USE_HTTPS": "0", "S3_VERIFY_SSL": "0"})
    assert (c.endpoint_url, c.verify, c.region) == ("http://minio:9000", False, "us-east-1")
    c = StoreConfig.from_env({"AWS_ENDPOINT_URL": "https://s3.local", "AWS_REGION": "eu-west-1"})
    assert (c.endpoint_url, c.verify, c.region) == ("https://s3.local", True, "eu-west-1")


def test_upload_then_download_is_checked(s3_store, store: ObjectStore, tmp_path: Path) -> None:
    base = BucketPath(s3_store.make_bucket("versions-roundtrip"), "prod/ctr")
    local = make_version(tmp_path)
    upload_version(store, base, 1, local)
    store.requests.clear()
    assert list_versions(store, base) == {1}
    assert store.requests == {"LIST": 1}
    dest = tmp_path / "cache" / "1"
    dest.parent.mkdir()
    download_version(store, base, 1, dest)
    assert file_hashes(dest) == file_hashes(local)
    assert (dest / MANIFEST_PATH).read_bytes() == (local / MANIFEST_PATH).read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["1"]  # no staging folder left


def test_a_version_without_its_manifest_is_incomplete(s3_store, store: ObjectStore, tmp_path: Path) -> None:
    base = BucketPath(s3_store.make_bucket("versions-half"), "ctr")
    local = make_version(tmp_path)
    store.upload(base.bucket, base.key("1", "model.onnx"), local / "model.onnx")
    assert list_versions(store, base) == {1}
    with pytest.raises(VersionIncomplete):
        download_version(store, base, 1, tmp_path / "1")
    assert not (tmp_path / "1").exists()


def test_a_changed_object_is_never_placed(s3_store, store: ObjectStore, tmp_path: Path) -> None:
    base = BucketPath(s3_store.make_bucket("versions-changed"), "ctr")
    upload_version(store, base, 1, make_version(tmp_path))
    store.put_bytes(base.bucket, base.key("1", "model.onnx"), b"replaced")
    with pytest.raises(StoreError, match="sha256") as err:
        download_version(store, base, 1, tmp_path / "1")
    assert err.value.reason == HASH_MISMATCH
    assert not (tmp_path / "1").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["v"]


def test_racing_claims_never_share_a_number(s3_store, store: ObjectStore) -> None:
    base = BucketPath(s3_store.make_bucket("versions-claims"), "ctr")
    got: list[int] = []
    threads = [
        threading.Thread(target=lambda i=i: got.append(claim_version(store, base, f"t{i}"))) for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [1, 2, 3, 4, 5, 6]


def test_delete_version_removes_the_manifest_first(s3_store, store: ObjectStore, tmp_path: Path) -> None:
    base = BucketPath(s3_store.make_bucket("versions-delete"), "ctr")
    n = claim_version(store, base, "me")
    upload_version(store, base, n, make_version(tmp_path))
    delete_version(store, base, n)
    assert list(store.list_objects(base)) == []


def test_wrong_credentials_are_denied(s3_store, s3_env, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3_store.make_bucket("versions-denied")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    with pytest.raises(StoreError) as err:
        ObjectStore(StoreConfig.from_env()).check_bucket(BucketPath(bucket))
    assert err.value.reason == DENIED
    assert "not-the-secret-at-all" not in str(err.value)


def test_an_unreachable_store_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    config = StoreConfig(endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=1, connect_timeout_s=1)
    with pytest.raises(StoreError) as err:
        ObjectStore(config).list_children(BucketPath("models", "ctr"))
    assert err.value.reason == UNREACHABLE
    assert "LIST s3://models/ctr/" in str(err.value)


@pytest.mark.slow
def test_a_large_version_downloads_in_bounded_memory(s3_store, s3_env, tmp_path: Path) -> None:
    """A 256 MiB model downloads with well under its size in extra memory: each of the parallel downloads
    streams 1 MiB chunks to disk (the issue: a 1 GiB model must not take 1 GiB of RAM beyond the loaded model)."""
    import os
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    size = 256 << 20
    local = tmp_path / "v"
    (local / "assets.extra").mkdir(parents=True)
    with (local / "model.onnx").open("wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    (local / MANIFEST_PATH).write_text(json.dumps({"version": 1, "files": file_hashes(local)}))
    base = BucketPath(s3_store.make_bucket("versions-large"), "ctr")
    store = ObjectStore(StoreConfig.from_env())
    upload_version(store, base, 1, local)
    (local / "model.onnx").unlink()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.ctr_store.download_memory",
            base.bucket,
            base.prefix,
            "1",
            str(tmp_path / "1"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    grew_kib = int(out.stdout.strip())
    print(f"peak RSS growth over a {size >> 20} MiB download: {grew_kib / 1024:.1f} MiB")
    assert (tmp_path / "1" / "model.onnx").stat().st_size == size
    assert grew_kib < 64 << 10, f"the download of {size >> 20} MiB grew the peak RSS by {grew_kib >> 10} MiB"
