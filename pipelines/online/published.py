"""What a model repository has published, local or in a bucket: the newest version and a local copy to warm-start from.

A local `--repo` is read in place. An `s3://BUCKET/PREFIX` one is read as servers read it (ctr_store/versions.py):
a version is published once its manifest exists, and a warm start downloads it (checked against the manifest)
into the trainer's work folder, since `python -m training --init-from` reads a local folder.

`python -m pipelines.online.published --repo REPO --into DIR` prints the local folder of the newest version
(nothing when there is none): scripts/daily.sh warm-starts from it.
"""

from __future__ import annotations

import argparse
import sys
from functools import cache
from pathlib import Path

from ctr_contract.repository import parse_version_dir, version_dirs
from ctr_store.errors import StoreError
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath, is_bucket_path
from ctr_store.versions import CLAIMS, VersionIncomplete, download_version, list_versions, read_manifest


@cache
def _store() -> ObjectStore:
    """One client for the process (thread-safe), made on first use from the AWS_* variables."""
    return ObjectStore()


def is_published(repo: Path | str, version: int) -> bool:
    """Does `repo` hold `version`, complete (in a bucket: its manifest exists)?"""
    if not is_bucket_path(repo):
        return (Path(repo) / str(version)).is_dir()
    try:
        read_manifest(_store(), BucketPath.parse(str(repo)), version)
    except VersionIncomplete:
        return False
    return True


def newest_version(repo: Path | str) -> int | None:
    """The newest published version number (what the servers serve), or None."""
    if not is_bucket_path(repo):
        versions = version_dirs(Path(repo)) if Path(repo).is_dir() else {}
        return max(versions) if versions else None
    base = BucketPath.parse(str(repo))
    for v in sorted(list_versions(_store(), base), reverse=True):
        if is_published(repo, v):  # a folder without a manifest is still being uploaded, or was abandoned
            return v
    return None


def next_version(repo: Path | str) -> int:
    """The number the next publish takes: after the newest version, and in a bucket after every claim too
    (a failed upload keeps its claim, so its number is never published)."""
    if not is_bucket_path(repo):
        return (newest_version(repo) or 0) + 1
    base = BucketPath.parse(str(repo))
    names = (key.rsplit("/", 1)[-1] for key, _ in _store().list_objects(base.child(CLAIMS)))
    taken = list_versions(_store(), base) | {v for n in names if (v := parse_version_dir(n)) is not None}
    return max(taken, default=0) + 1


def local_version(repo: Path | str, version: int, into: Path) -> Path:
    """A local folder holding `version`: the repository's own, or a checked download, `into/<version>`."""
    if not is_bucket_path(repo):
        return Path(repo) / str(version)
    dest = into / str(version)
    if not dest.is_dir():  # a download appears whole, by one rename, or not at all
        dest.parent.mkdir(parents=True, exist_ok=True)
        download_version(_store(), BucketPath.parse(str(repo)), version, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.online.published", description=__doc__.splitlines()[0]
    )
    p.add_argument("--repo", required=True, help="model base path: a folder or s3://BUCKET/PREFIX")
    p.add_argument("--into", type=Path, required=True, help="a bucket's version is downloaded into DIR/<N>")
    args = p.parse_args(argv)
    try:
        v = newest_version(args.repo)
        if v is not None:
            print(local_version(args.repo, v, args.into))
    except (StoreError, ValueError) as e:
        print(f"published: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
