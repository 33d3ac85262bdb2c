"""`python -m export --repo s3://BUCKET/PREFIX` against a real SeaweedFS (tests/object_store.py): the version
and its manifest, the claim, the quality gate against the bucket's newest version, retention, racing exports,
a failed upload, wrong credentials."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ctr_contract.repository import MANIFEST_PATH, TRITON_CONFIG
from ctr_contract.signatures import OUTPUT_NAMES
from ctr_store.errors import StoreError
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import VersionIncomplete, list_versions, read_manifest
from export.errors import PublishError
from export.onnx.onnx_export import INPUT_NAME
from export.publish.bucket import BucketRepository
from export.publish.repository import triton_config_text
from tests.conftest import Published, RunModule
from tests.export.export_runs import WIDTH, make_run
from tests.helpers import REPO_ROOT
from tests.object_store import SeaweedS3


def _objects(store: ObjectStore, base: BucketPath) -> dict[str, bytes]:
    """Every object under `base`, by its key relative to `base`."""
    out = {}
    for key, _ in store.list_objects(base):
        out[key.removeprefix(base.prefix + "/")] = store.get_bytes(base.bucket, key, 1 << 24)
    return out


def _wait_readable(store: ObjectStore, bucket: str, key: str, deadline_s: float = 60.0) -> None:
    """Until a restarted store serves `key` (its gateway answers before its volume server does)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            store.get_bytes(bucket, key, 1 << 16)
            return
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _checked(store: ObjectStore, base: BucketPath, version: int) -> dict[str, object]:
    """The version's manifest, after checking that its objects are exactly the manifest's files, each with its
    sha256."""
    raw, files = read_manifest(store, base, version)
    objects = _objects(store, base.child(str(version)))
    assert sorted(objects) == sorted([*files, MANIFEST_PATH])
    assert {rel: hashlib.sha256(objects[rel]).hexdigest() for rel in files} == files
    manifest: dict[str, object] = json.loads(raw)
    return manifest


def _staged(published: Callable[..., Published], root: Path, name: str) -> Path:
    """A complete version folder, as export stages it (a copy of the session's relu export)."""
    return Path(shutil.copytree(published("relu").version_dir, root / name))


@pytest.mark.slow  # two whole exports (~8 s each); the claim-and-publish step stays in make test below
def test_export_to_a_bucket_publishes_a_checked_version_then_gates_on_it_and_retains(
    s3_store: SeaweedS3, s3_env: dict[str, str], run_export: RunModule, tmp_path: Path
) -> None:
    bucket = s3_store.make_bucket("export-publish")
    url = f"s3://{bucket}/prod/ctr"
    base, store = BucketPath.parse(url), ObjectStore()
    run = make_run(tmp_path / "run")
    first = run_export("--run", run, "--repo", url, check=True)
    assert first.stdout.splitlines()[0].startswith(f"published version 1 at {url}/1 in ")
    assert list_versions(store, base) == {1}
    assert _checked(store, base, 1)["version"] == 1
    config = triton_config_text("ctr", WIDTH, INPUT_NAME, OUTPUT_NAMES)
    assert store.get_bytes(bucket, base.key(TRITON_CONFIG), 1 << 16) == config.encode()
    assert [k for k, _ in store.list_objects(base.child(".claims"))] == ["prod/ctr/.claims/1"]

    # The second export's quality gate scores version 1, downloaded from the bucket; --keep 1 removes it.
    second = run_export("--run", run, "--repo", url, "--keep", "1", check=True)
    lines = second.stdout.splitlines()
    assert lines[0].startswith(f"published version 2 at {url}/2 in ")
    assert "; version 1 AUC " in next(line for line in lines if line.startswith("quality gate: "))
    assert lines[-1] == "retention: removed versions [1]"
    # Only objects count: SeaweedFS still lists the emptied `1/` as a prefix (S3 itself would not).
    assert {key.split("/")[0] for key in _objects(store, base)} == {".claims", "2", TRITON_CONFIG}
    assert _checked(store, base, 2)["version"] == 2
    assert [k for k, _ in store.list_objects(base.child(".claims"))] == ["prod/ctr/.claims/2"]


def test_publishes_racing_on_one_bucket_take_distinct_numbers(
    s3_store: SeaweedS3, s3_env: dict[str, str], published: Callable[..., Published], tmp_path: Path
) -> None:
    bucket = s3_store.make_bucket("export-race-threads")
    url = f"s3://{bucket}/ctr"
    racers = 4
    staged = [_staged(published, tmp_path, f"stage-{i}") for i in range(racers)]  # one export, in this thread
    start = threading.Barrier(racers, timeout=60)
    got: dict[int, int] = {}

    def publish(i: int) -> None:
        repo = BucketRepository(url)
        try:
            chosen = repo.choose_version(None)  # every racer sees an empty bucket: 1
            start.wait()
            version = repo.claim(None, chosen)
            manifest = json.loads((staged[i] / MANIFEST_PATH).read_text())
            (staged[i] / MANIFEST_PATH).write_text(json.dumps({**manifest, "version": version}))
            repo.publish(staged[i], version)
            got[i] = version
        finally:
            repo.close()

    threads = [threading.Thread(target=publish, args=(i,), daemon=True) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got.values()) == [1, 2, 3, 4]
    store, base = ObjectStore(), BucketPath.parse(url)
    assert list_versions(store, base) == {1, 2, 3, 4}
    assert [_checked(store, base, v)["version"] for v in (1, 2, 3, 4)] == [1, 2, 3, 4]


def test_an_object_the_store_refuses_fails_the_upload_and_leaves_no_object_and_no_manifest(
    s3_store: SeaweedS3, s3_env: dict[str, str], published: Callable[..., Published], tmp_path: Path
) -> None:
    bucket = s3_store.make_bucket("export-refused")
    url = f"s3://{bucket}/ctr"
    staged = _staged(published, tmp_path, "stage")
    # A key over S3's 1,024 bytes: the store refuses this one object (KeyTooLongError) while the others upload.
    deep = staged / "assets.extra" / Path(*["d" * 250] * 5) / "deep.bin"
    deep.parent.mkdir(parents=True)
    deep.write_bytes(b"x")
    repo = BucketRepository(url)
    try:
        version = repo.claim(None, repo.choose_version(None))
        with pytest.raises(PublishError) as caught:
            repo.publish(staged, version)
    finally:
        repo.close()
    key = f"ctr/1/{deep.relative_to(staged).as_posix()}"
    assert str(caught.value).startswith(
        f"cannot upload version 1 to {url}: PUT s3://{bucket}/{key}: KeyTooLongError: Your key is too long.;"
    )
    assert str(caught.value).endswith(
        f"; nothing was published (no manifest), and {url}/.claims/1 keeps the number from being reused"
    )
    store, base = ObjectStore(), BucketPath.parse(url)
    assert sorted(_objects(store, base)) == [".claims/1"]  # the objects it wrote are gone; the claim stays
    with pytest.raises(VersionIncomplete):
        read_manifest(store, base, 1)
    again = BucketRepository(url)
    try:
        assert again.claim(None, again.choose_version(None)) == 2  # the failed number is never reused
    finally:
        again.close()


@pytest.mark.slow  # ~30 s: a private store started twice and stopped twice
def test_a_store_stopped_after_the_claim_fails_the_publish_and_the_number_is_never_reused(
    published: Callable[..., Published], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SeaweedS3(tmp_path / "s3") as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        bucket = s3.make_bucket("export-outage")
        url = f"s3://{bucket}/ctr"
        staged = _staged(published, tmp_path, "stage")
        repo = BucketRepository(url)
        try:
            repo.prepare()
            version = repo.claim(None, repo.choose_version(None))
            s3.stop()
            with pytest.raises(PublishError) as caught:
                repo.publish(staged, version)
        finally:
            repo.close()
        assert str(caught.value).startswith(f"cannot upload version 1 to {url}: PUT s3://{bucket}/ctr/1/")
        assert "cannot reach the store" in str(caught.value)
        s3.start()
        store, base = ObjectStore(), BucketPath.parse(url)
        _wait_readable(store, bucket, base.key(".claims", "1"))  # the volume server answers a little later
        assert sorted(_objects(store, base)) == [".claims/1"]
        assert list_versions(store, base) == set()
        again = BucketRepository(url)
        try:
            assert again.claim(None, again.choose_version(None)) == 2
        finally:
            again.close()


def test_wrong_credentials_fail_in_one_line_before_any_slow_step(
    s3_store: SeaweedS3,
    s3_env: dict[str, str],
    run_export: RunModule,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = s3_store.make_bucket("export-denied")
    secret = "wrong-secret-never-logged"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    proc = run_export("--run", make_run(tmp_path / "run"), "--repo", f"s3://{bucket}/ctr")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"export: error: model repository s3://{bucket}/ctr (endpoint {s3_env['AWS_ENDPOINT_URL']} region "
        f"us-east-1): HEAD s3://{bucket}: access denied (403: Forbidden); check the credentials and policy"
    ]
    assert proc.stdout == "" and secret not in proc.stderr
    assert list(s3_store.client().list_objects_v2(Bucket=bucket).get("Contents", [])) == []


def test_a_requested_version_is_claimed_once_and_then_refused_with_the_fix(
    s3_store: SeaweedS3, s3_env: dict[str, str]
) -> None:
    url = f"s3://{s3_store.make_bucket('export-requested')}/ctr"
    repo = BucketRepository(url)
    try:
        assert repo.claim(7, repo.choose_version(7)) == 7
        with pytest.raises(PublishError) as early:
            repo.choose_version(7)
        assert str(early.value) == (
            f"version 7 already exists or is claimed in {url}; versions are never overwritten (omit --version "
            "to publish 8)"
        )
        with pytest.raises(PublishError) as late:  # another export claimed it after this one chose it
            repo.claim(7, 7)
        assert str(late.value) == (
            f"version 7 was claimed in {url} by another export meanwhile; not overwriting it (omit --version to "
            "publish the next number)"
        )
        assert repo.claim(None, repo.choose_version(None)) == 8
    finally:
        repo.close()


def test_an_s3_repo_without_a_prefix_is_refused_with_the_fix(run_export: RunModule, tmp_path: Path) -> None:
    proc = run_export("--run", make_run(tmp_path / "run"), "--repo", "s3://models")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "export: error: --repo s3://models names no model base path; expected s3://BUCKET/PREFIX, e.g. "
        "s3://models/ctr"
    ]


@pytest.mark.slow  # two fresh export processes (~15 s each, TensorFlow's import included)
def test_two_export_processes_racing_publish_two_versions(
    s3_store: SeaweedS3, s3_env: dict[str, str], tmp_path: Path
) -> None:
    bucket = s3_store.make_bucket("export-race-processes")
    url = f"s3://{bucket}/ctr"
    runs = [make_run(tmp_path / f"run{i}", seed=i) for i in range(2)]
    # --force: each run's gate would otherwise compare it with whichever version won the race first.
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "export", "--run", str(run), "--repo", url, "--force"],
            cwd=REPO_ROOT,
            env={**os.environ, **s3_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in runs
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    firsts = sorted(out.splitlines()[0].split(" in ")[0] for out, _ in outs)
    assert firsts == [f"published version 1 at {url}/1", f"published version 2 at {url}/2"]
    store, base = ObjectStore(), BucketPath.parse(url)
    assert list_versions(store, base) == {1, 2}
    assert [_checked(store, base, v)["version"] for v in (1, 2)] == [1, 2]
