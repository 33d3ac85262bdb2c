"""`--data s3://...` against a real SeaweedFS: a file, a prefix, a glob, gzip and Parquet prepare exactly as the
same files on disk; a changed object is parsed again; a missing or refused path is one line naming it."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ctr_store.arrow import s3_filesystem
from ctr_store.config import StoreConfig
from tests.object_store import SECRET
from tests.training.train_runs import TINY_RUN
from training.data.cache import ensure_cache
from training.data.preparation import Prepared, prepare_data
from training.data.sources import resolve_data
from training.errors import DataError

Run = Callable[..., subprocess.CompletedProcess]
BUCKET = "train-data"


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def local(synth_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic rows as the files the cases read: whole, gzipped, split in two days, Parquet."""
    root = tmp_path_factory.mktemp("local")
    text = synth_file.read_bytes()
    (root / "one").mkdir()
    (root / "one" / "train.txt").write_bytes(text)
    (root / "gz").mkdir()
    (root / "gz" / "train.txt.gz").write_bytes(gzip.compress(text, mtime=0))
    (root / "two").mkdir()
    lines = text.splitlines(keepends=True)
    (root / "two" / "day_0.txt").write_bytes(b"".join(lines[:2500]))
    (root / "two" / "day_1.txt").write_bytes(b"".join(lines[2500:]))
    (root / "pq").mkdir()
    (root / "pq-cache").mkdir()
    cache, _ = ensure_cache(root / "one" / "train.txt", cache_dir=root / "pq-cache")
    shutil.copy(cache, root / "pq" / "train.parquet")  # a Parquet file with row_id, label, I*, C*
    return root


@pytest.fixture(scope="module")
def bucket(s3_store, local: Path) -> str:  # type: ignore[no-untyped-def]
    """The same files in a bucket, plus objects a prefix must skip (not data, and one level down)."""
    s3_store.make_bucket(BUCKET)
    client = s3_store.client()
    for path in local.rglob("*"):
        if path.is_file() and "pq-cache" not in path.parts:
            client.upload_file(str(path), BUCKET, f"criteo/{path.relative_to(local).as_posix()}")
    client.put_object(Bucket=BUCKET, Key="criteo/two/README.md", Body=b"not data")
    client.put_object(Bucket=BUCKET, Key="criteo/two/old/day_9.txt", Body=b"not read: one level down")
    return BUCKET


def prepared(data: str | Path, cache_dir: Path | None) -> Prepared:
    return prepare_data(data, cache_dir, 0.1, 128, None, False, quiet)


@pytest.mark.parametrize(
    ("remote", "on_disk"),
    [
        ("criteo/one/train.txt", "one/train.txt"),
        ("criteo/gz/train.txt.gz", "gz/train.txt.gz"),
        ("criteo/two/", "two"),
        ("criteo/two/day_*.txt", "two/day_*.txt"),
        ("criteo/*/day_?.txt", "two/day_?.txt"),
        ("criteo/pq/train.parquet", "pq/train.parquet"),
    ],
)
def test_data_in_a_bucket_prepares_exactly_like_the_same_files_on_disk(
    s3_env: dict[str, str], bucket: str, local: Path, tmp_path: Path, remote: str, on_disk: str
) -> None:
    url = f"s3://{bucket}/{remote}"
    names = [Path(str(f.path)).name for f in resolve_data(url)]
    assert names == [Path(str(f.path)).name for f in resolve_data(local / on_disk)]
    assert names == (
        ["day_0.txt", "day_1.txt"] if "day" in on_disk or on_disk == "two" else [Path(remote).name]
    )
    disk = prepared(local / on_disk, tmp_path / "disk")
    s3 = prepared(url, tmp_path / "s3")
    assert s3.spec.to_dict() == disk.spec.to_dict()
    assert (s3.data.rows("train"), s3.data.rows("val")) == (disk.data.rows("train"), disk.data.rows("val"))
    assert s3.data.rows("train") + s3.data.rows("val") == 4000
    for split in ("train", "val"):
        assert s3.encoded[split].read_bytes() == disk.encoded[split].read_bytes()
    # Only derived files are on disk: the Parquet caches of text objects, and the encoded records.
    kept = sorted(p.name for p in (tmp_path / "s3").iterdir())
    assert not any(name.endswith((".txt", ".gz", ".parquet")) and ".cache." not in name for name in kept)


def test_an_object_is_parsed_once_and_again_when_it_changes(
    s3_store, s3_env: dict[str, str], local: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    client = s3_store.client()
    text = (local / "one" / "train.txt").read_bytes()
    client.put_object(Bucket=BUCKET, Key="changing/train.txt", Body=text)
    url = f"s3://{BUCKET}/changing/train.txt"
    first = prepared(url, tmp_path)
    assert "parse" in first.timings and first.report.rows == 4000
    again = prepared(url, tmp_path)
    assert "parse" not in again.timings and "fit" not in again.timings  # cache and records reused
    client.put_object(Bucket=BUCKET, Key="changing/train.txt", Body=b"".join(text.splitlines(True)[:3000]))
    changed = prepared(url, tmp_path)
    assert "parse" in changed.timings and changed.report.rows == 3000


def test_missing_paths_fail_in_one_line_naming_them(s3_env: dict[str, str], bucket: str) -> None:
    cases = {
        f"s3://{bucket}/criteo/one/trian.txt": (
            f"no object or prefix s3://{bucket}/criteo/one/trian.txt in bucket '{bucket}': check the key "
            "(keys are case-sensitive)"
        ),
        "s3://no-such-bucket/criteo/train.txt": (
            "no bucket 'no-such-bucket' for --data s3://no-such-bucket/criteo/train.txt: create it, or check the name"
        ),
        f"s3://{bucket}/criteo/two/day_*.tsv": f"no data files match 's3://{bucket}/criteo/two/day_*.tsv'",
        f"s3://{bucket}/criteo/empty/": None,  # nothing under it: no such prefix either
    }
    for url, message in cases.items():
        with pytest.raises(DataError) as err:
            resolve_data(url)
        expected = message or f"no object or prefix {url} in bucket '{bucket}'"
        assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_refused_credentials_fail_in_one_line_without_the_secret(
    s3_env: dict[str, str], bucket: str, run_module: Run
) -> None:
    url = f"s3://{bucket}/criteo/one/train.txt"
    wrong = "wrong-secret-0123456789"
    proc = run_module("training.prepare", "--data", url, env={"AWS_SECRET_ACCESS_KEY": wrong}, timeout=120)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: HEAD {url}: denied (") and "check the credentials" in line
    assert wrong not in line and SECRET not in line


def test_an_unreachable_store_fails_in_one_line_naming_the_path(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # nothing listens on port 1
    with pytest.raises(DataError) as err:
        resolve_data("s3://data/criteo/train.txt")
    message = str(err.value)
    assert message.startswith("HEAD s3://data/criteo/train.txt: unreachable (") and "\n" not in message
    assert message.endswith("); check AWS_ENDPOINT_URL and that the store is up")


def test_the_filesystem_takes_the_endpoint_region_and_tls_rule_of_the_store_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyarrow.fs import S3FileSystem

    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)

    timeouts = {"connect_timeout": 5.0, "request_timeout": 30.0}
    got = s3_filesystem(StoreConfig.from_env({"S3_ENDPOINT": "store:9000", "S3_USE_HTTPS": "0"}))
    assert got.equals(
        S3FileSystem(region="us-east-1", scheme="http", endpoint_override="store:9000", **timeouts)
    )
    got = s3_filesystem(
        StoreConfig.from_env({"AWS_ENDPOINT_URL": "https://s3.local:8443", "AWS_REGION": "eu-west-1"})
    )
    assert got.equals(
        S3FileSystem(region="eu-west-1", scheme="https", endpoint_override="s3.local:8443", **timeouts)
    )
    assert not got.equals(
        S3FileSystem(region="eu-west-1", scheme="https", endpoint_override="s3.local", **timeouts)
    )
    with pytest.raises(ValueError) as err:
        s3_filesystem(StoreConfig.from_env({"AWS_ENDPOINT_URL": "https://s3.local", "S3_VERIFY_SSL": "0"}))
    assert str(err.value) == (
        "S3_VERIFY_SSL=0 with the https endpoint https://s3.local: pyarrow's S3 client always checks "
        "certificates; give the store's CA bundle as AWS_CA_BUNDLE instead"
    )
    monkeypatch.setenv("AWS_CA_BUNDLE", "/etc/store-ca.pem")  # what boto3 reads too
    got = s3_filesystem(StoreConfig.from_env({"AWS_ENDPOINT_URL": "https://s3.local:8443"}))
    expected = {"endpoint_override": "s3.local:8443", "tls_ca_file_path": "/etc/store-ca.pem"}
    assert got.equals(S3FileSystem(region="us-east-1", scheme="https", **expected, **timeouts))


@pytest.mark.slow  # two training runs (make test-slow)
def test_training_from_a_bucket_equals_training_from_the_same_file_on_disk(
    s3_env: dict[str, str], bucket: str, local: Path, data_copy: Path, tmp_path: Path, run_module: Run
) -> None:
    url = f"s3://{bucket}/criteo/one/train.txt"
    assert data_copy.read_bytes() == (local / "one" / "train.txt").read_bytes()  # the object's bytes
    runs = {}
    for name, data in (("disk", data_copy), ("s3", url)):
        out = tmp_path / name
        run_module(
            "training",
            "--data",
            data,
            "--out",
            out,
            "--cache-dir",
            tmp_path / f"cache-{name}",
            *TINY_RUN,
            check=True,
        )
        runs[name] = out
    disk, s3 = runs["disk"], runs["s3"]
    assert (s3 / "feature_spec.json").read_bytes() == (disk / "feature_spec.json").read_bytes()
    m_disk, m_s3 = (json.loads((r / "metrics.json").read_text()) for r in (disk, s3))
    for key in ("val_auc", "val_logloss", "global_step", "epochs", "train_rows", "val_rows"):
        assert m_s3[key] == m_disk[key], key
    assert m_s3["config"]["data"] == url and m_s3["oracle_auc"] is None  # no oracle file beside an object
    a, b = (torch.load(r / "checkpoints" / "best.ckpt", weights_only=False)["state_dict"] for r in (disk, s3))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
