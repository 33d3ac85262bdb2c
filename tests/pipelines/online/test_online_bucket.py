"""The online trainer with `--repo s3://BUCKET/PREFIX` (a real SeaweedFS): it publishes to the bucket and
warm-starts from the bucket's newest version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ctr_contract.repository import MANIFEST_PATH
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import read_manifest, upload_version
from pipelines.online.state import load
from tests.conftest import Published, RunModule
from tests.object_store import SeaweedS3
from tests.pipelines.online.test_online_trainer import INTERVAL_S, REPO_ROOT, WINDOW_S, _traffic


def test_the_daily_loops_warm_start_is_the_buckets_newest_published_version_downloaded(
    s3_store: SeaweedS3,
    s3_env: dict[str, str],
    published: Callable[..., Published],
    run_module: RunModule,
    tmp_path: Path,
) -> None:
    bucket = s3_store.make_bucket("online-newest")
    url = f"s3://{bucket}/ctr"
    store, base = ObjectStore(), BucketPath.parse(url)
    assert (
        run_module("pipelines.online.published", "--repo", url, "--into", tmp_path, env=s3_env).stdout == ""
    )
    source = published("relu").version_dir
    upload_version(store, base, 1, source)
    upload_version(store, base, 2, source)
    store.delete(bucket, [base.key("2", MANIFEST_PATH)])  # version 2 without its manifest: never a warm start
    proc = run_module(
        "pipelines.online.published", "--repo", url, "--into", tmp_path / "versions", env=s3_env
    )
    assert (proc.returncode, proc.stdout) == (0, f"{tmp_path / 'versions' / '1'}\n")

    def files(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert files(tmp_path / "versions" / "1") == files(source)  # every file, byte for byte (no empty assets/)


@pytest.mark.slow  # trains and exports twice (~1-2 min)
def test_two_intervals_publish_versions_1_and_2_to_the_bucket_the_second_warm_started_from_it(
    s3_store: SeaweedS3, s3_env: dict[str, str], tmp_path: Path
) -> None:
    bucket = s3_store.make_bucket("online-publish")
    url = f"s3://{bucket}/ctr"
    first = int(time.time() // INTERVAL_S) - 100  # long closed intervals: the trainer never waits
    _traffic(tmp_path, first, {0: 150, 1: 150})
    args = [
        *(
            "--logs",
            tmp_path / "logs",
            "--clicks",
            tmp_path / "clicks",
            "--repo",
            url,
            "--work",
            tmp_path / "work",
        ),
        *("--interval-s", INTERVAL_S, "--window-s", WINDOW_S, "--start", first * INTERVAL_S),
        *("--until", (first + 2) * INTERVAL_S - 1, "--train-args", "--batch-size 256 --val-fraction 0.2"),
        # A few hundred rows an interval: the gate's figures are noise, so it lets every candidate through.
        *(
            "--calibration",
            "none",
            "--max-calibration-gap",
            "0.99",
            "--max-auc-drop",
            "1",
            "--max-ece-rise",
            "1",
        ),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.online", *map(str, args)],
        cwd=REPO_ROOT,
        env={**os.environ, **s3_env, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = load(tmp_path / "work")
    assert state is not None and state.pending is None
    assert [(o["interval"], o["outcome"], o.get("version")) for o in state.outcomes] == [
        (first, "published", 1),
        (first + 1, "published", 2),
    ]
    store, base = ObjectStore(), BucketPath.parse(url)
    for v in (1, 2):
        assert json.loads(read_manifest(store, base, v)[0])["version"] == v
    # Interval 2 warm-started from version 1, downloaded (checked) from the bucket into the work folder.
    local = tmp_path / "work" / "versions" / "1" / MANIFEST_PATH
    assert local.read_bytes() == read_manifest(store, base, 1)[0]
    metrics = json.loads((tmp_path / "work" / "runs" / str(first + 1) / "run" / "metrics.json").read_text())
    assert metrics["config"]["init_from"] == str(tmp_path / "work" / "versions" / "1")
