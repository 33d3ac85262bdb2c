"""Object-store clients side by side against one SeaweedFS: boto3, minio and obstore list and download a model
version of about 100 MB (docs/decisions/0008-object-storage-client.md).

    python -m bench.harness.store_clients --client-path minio=/tmp/x/minio --client-path obstore=/tmp/x/obstore
    python -m bench.harness.store_clients --sizes boto3=/tmp/x/boto3 minio=/tmp/x/minio --base-report base.json

The first form starts a private SeaweedFS (tests/object_store.py), writes `ctr/1/`, `ctr/2/` (small) and `ctr/3/`
(`model.onnx` of `--model-mb` MB and four small files, with its manifest), then runs each client `--reps` times,
each time in a fresh process (`--worker NAME`) whose path starts with that client's `pip install --target` folder
(never .venv): import, client and first listing (cold); one more delimited listing of `ctr/` (warm); the download
of `ctr/3/`'s objects to files (8 threads, 1 MiB chunks). It prints the median and range of each, the process's
peak resident memory, and whether a second `If-None-Match: *` write of one key is refused. The clients take turns, so the machine's other work
spreads over all of them. The second form prints what each `--target` folder's distributions take on disk,
and the part not already installed by the serving image (the distributions of pip's `--report` of its extras).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BUCKET = "clients"
VERSION = "ctr/3/"
CHUNK = 1 << 20
THREADS = 8
SMALL = {"assets.extra/feature_spec.json": 60_000, "model_raw.onnx": 900_000, "warmup.tfrecord": 20_000}
CLIENTS = ("boto3", "minio", "obstore", "ctr_store")  # ctr_store: boto3 as serving uses it, sha256-checked


class Ops:
    """One client's calls: the delimited listing, one object to a file, a conditional write."""

    def __init__(
        self,
        versions: Callable[[], list[str]],
        objects: Callable[[], list[str]],
        fetch: Callable[[str, Path], None],
        put_if_absent: Callable[[str, bytes], bool],
        download: Callable[[Path], None] | None = None,
    ) -> None:
        self.versions, self.objects, self.fetch, self.put_if_absent = versions, objects, fetch, put_if_absent
        self.download = download


def boto3_ops(endpoint: str, region: str) -> Ops:
    import boto3
    from botocore.config import Config

    c = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        config=Config(max_pool_connections=16, s3={"addressing_style": "path"}),
    )

    def versions() -> list[str]:
        page = c.list_objects_v2(Bucket=BUCKET, Prefix="ctr/", Delimiter="/")
        return [p["Prefix"] for p in page.get("CommonPrefixes", ())]

    def objects() -> list[str]:
        return [o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix=VERSION).get("Contents", ())]

    def fetch(key: str, dest: Path) -> None:
        body = c.get_object(Bucket=BUCKET, Key=key)["Body"]
        with dest.open("wb") as out:
            for chunk in body.iter_chunks(CHUNK):
                out.write(chunk)

    def put_if_absent(key: str, data: bytes) -> bool:
        try:
            c.put_object(Bucket=BUCKET, Key=key, Body=data, IfNoneMatch="*")
        except c.exceptions.ClientError as exc:
            if exc.response["ResponseMetadata"]["HTTPStatusCode"] in (409, 412):
                return False
            raise
        return True

    return Ops(versions, objects, fetch, put_if_absent)


def ctr_store_ops(endpoint: str, region: str) -> Ops:
    """What serving runs: ctr_store's listing and `download_version` (parallel, sha256-checked, one rename)."""
    from ctr_store.config import StoreConfig
    from ctr_store.objects import ObjectStore
    from ctr_store.url import BucketPath
    from ctr_store.versions import download_version, list_versions

    store = ObjectStore(StoreConfig(endpoint_url=endpoint, region=region))
    base = BucketPath(BUCKET, "ctr")

    def download(dest: Path) -> None:
        download_version(store, base, 3, dest / "3", workers=THREADS)

    def put_if_absent(key: str, data: bytes) -> bool:
        return store.put_bytes(BUCKET, key, data, if_absent=True)

    return Ops(
        lambda: [str(v) for v in sorted(list_versions(store, base))],
        lambda: [k for k, _ in store.list_objects(base.child("3"))],
        lambda key, dest: None,
        put_if_absent,
        download,
    )


def minio_ops(endpoint: str, region: str) -> Ops:
    from minio import Minio

    url = urlsplit(endpoint)
    c = Minio(
        url.netloc,
        os.environ["AWS_ACCESS_KEY_ID"],
        os.environ["AWS_SECRET_ACCESS_KEY"],
        secure=url.scheme == "https",
        region=region,
    )

    def fetch(key: str, dest: Path) -> None:
        resp = c.get_object(BUCKET, key)
        try:
            with dest.open("wb") as out:
                for chunk in resp.stream(CHUNK):
                    out.write(chunk)
        finally:
            resp.close()
            resp.release_conn()

    def put_if_absent(key: str, data: bytes) -> bool:
        # No conditional put in minio's API: a header given as metadata is sent as x-amz-meta-if-none-match.
        c.put_object(BUCKET, key, io.BytesIO(data), len(data), metadata={"If-None-Match": "*"})
        return True

    return Ops(
        lambda: [o.object_name for o in c.list_objects(BUCKET, prefix="ctr/") if o.is_dir],
        lambda: [o.object_name for o in c.list_objects(BUCKET, prefix=VERSION, recursive=True)],
        fetch,
        put_if_absent,
    )


def obstore_ops(endpoint: str, region: str) -> Ops:
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError
    from obstore.store import S3Store

    # Credentials from the environment, as the AWS tools read them (obstore's own chain).
    s = S3Store(BUCKET, endpoint=endpoint, region=region, client_options={"allow_http": True})

    def fetch(key: str, dest: Path) -> None:
        with dest.open("wb") as out:
            for chunk in obstore.get(s, key).stream(min_chunk_size=CHUNK):
                out.write(chunk)

    def put_if_absent(key: str, data: bytes) -> bool:
        try:
            obstore.put(s, key, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    return Ops(
        lambda: list(obstore.list_with_delimiter(s, "ctr/")["common_prefixes"]),
        lambda: [m["path"] for batch in obstore.list(s, VERSION) for m in batch],
        fetch,
        put_if_absent,
    )


FACTORIES = {"boto3": boto3_ops, "minio": minio_ops, "obstore": obstore_ops, "ctr_store": ctr_store_ops}


def worker(name: str, dest: Path, check_put: bool) -> dict[str, Any]:
    """One run of one client in this process: cold start, a warm listing, the version's download."""
    endpoint, region = os.environ["AWS_ENDPOINT_URL"], os.environ.get("AWS_REGION", "us-east-1")
    t0 = time.perf_counter()
    ops = FACTORIES[name](endpoint, region)
    versions = ops.versions()
    cold = time.perf_counter() - t0
    rss_client = _peak_rss_mib()
    t = time.perf_counter()
    assert ops.versions() == versions and len(versions) == 3, versions
    warm = time.perf_counter() - t
    t = time.perf_counter()
    if ops.download is not None:
        ops.download(dest)
    else:
        keys = ops.objects()
        for key in keys:
            (dest / key).parent.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda k: ops.fetch(k, dest / k), keys))
    download = time.perf_counter() - t
    got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    rss_mib = _peak_rss_mib()
    out: dict[str, Any] = {
        "cold_s": cold,
        "list_s": warm,
        "download_s": download,
        "bytes": got,
        "rss": rss_mib,
        "rss_client": rss_client,
    }
    if check_put:
        key = f"claims/{name}-{time.time_ns()}"
        out["conditional"] = [ops.put_if_absent(key, b"a"), ops.put_if_absent(key, b"b")]
    return out


def _peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: getrusage's maxrss would carry the parent's over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_version(client: Any, model_mb: int) -> int:
    """`ctr/1/`, `ctr/2/` (small) and `ctr/3/` (the model and the small files, with its manifest); its bytes."""
    from ctr_contract.manifest import file_hashes
    from ctr_contract.repository import MANIFEST_PATH

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "model.onnx").write_bytes(os.urandom(model_mb << 20))
        for rel, size in SMALL.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(os.urandom(size))
        (root / MANIFEST_PATH).write_text(json.dumps({"version": 3, "files": file_hashes(root)}))
        files = sorted(p for p in root.rglob("*") if p.is_file())
        for version in ("1", "2"):
            client.put_object(Bucket=BUCKET, Key=f"ctr/{version}/{MANIFEST_PATH}", Body=b"{}")
        for p in files:
            client.upload_file(str(p), BUCKET, VERSION + p.relative_to(root).as_posix())
        return sum(p.stat().st_size for p in files)


def measure(args: argparse.Namespace) -> None:
    from tests.object_store import SeaweedS3

    paths = dict(pair.split("=", 1) for pair in args.client_path)
    root = Path(tempfile.mkdtemp(prefix="store-clients-"))
    scratch = Path(
        tempfile.mkdtemp(prefix="store-clients-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    )
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.clients}
    try:
        with SeaweedS3(root) as store:
            store.make_bucket(BUCKET)
            size = write_version(store.client(), args.model_mb)
            print(f"version ctr/3/: {size:,} bytes in {len(SMALL) + 2} objects; {args.reps} runs per client")
            load = os.getloadavg()[0]
            for rep in range(args.reps):
                for name in args.clients:
                    dest = scratch / f"{name}-{rep}"
                    dest.mkdir()
                    extra = [paths[name]] if name in paths else []
                    env = {
                        **os.environ,
                        **store.env(),
                        "PYTHONPATH": os.pathsep.join([*extra, str(Path.cwd())]),
                    }
                    cmd = [
                        sys.executable,
                        "-m",
                        "bench.harness.store_clients",
                        "--worker",
                        name,
                        "--dest",
                        str(dest),
                    ]
                    proc = subprocess.run(
                        cmd + ["--check-put"] * (rep == 0), env=env, capture_output=True, text=True
                    )
                    shutil.rmtree(dest, ignore_errors=True)
                    if proc.returncode != 0:
                        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
                    runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average (1 min) {load:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs")
    print(
        "| client | cold: import + client + first listing | warm delimited listing | download of ctr/3/ | MB/s "
        "| peak RSS: after the listing / after the download | If-None-Match: * refuses the second write |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        assert all(r["bytes"] >= size for r in rs), (name, [r["bytes"] for r in rs])
        cells = [
            _spread([r[k] for r in rs], unit)
            for k, unit in (("cold_s", "ms"), ("list_s", "ms"), ("download_s", "s"))
        ]
        mbps = size / 1e6 / statistics.median(r["download_s"] for r in rs)
        first, second = rs[0]["conditional"]
        refused = "yes" if first and not second else "no (the second write replaced the object)"
        client_mib, peak_mib = (statistics.median(r[k] for r in rs) for k in ("rss_client", "rss"))
        print(
            f"| {name} | {' | '.join(cells)} | {mbps:,.0f} | {client_mib:.0f} / {peak_mib:.0f} MiB | {refused} |"
        )


def _spread(values: list[float], unit: str) -> str:
    k = 1000 if unit == "ms" else 1
    fmt = "{:.1f}" if unit == "ms" else "{:.2f}"
    lo, med, hi = (fmt.format(v * k) for v in (min(values), statistics.median(values), max(values)))
    return f"{med} {unit} ({lo} to {hi})"


def sizes(pairs: list[str], base_report: Path | None) -> None:
    """Bytes on disk of each `--target` folder's distributions (from their RECORD files), all and added."""
    base = set()
    if base_report is not None:
        base = {_norm(i["metadata"]["name"]) for i in json.loads(base_report.read_text())["install"]}
    print("| client | du -sh (apparent) | distributions (MiB) | added to the serving image | of which |")
    print("|---|---|---|---|---|")
    for name, folder in (pair.split("=", 1) for pair in pairs):
        du, apparent = (
            subprocess.run(["du", "-sh", *flag, folder], capture_output=True, text=True).stdout.split()[0]
            for flag in ([], ["--apparent-size"])
        )
        dists, added = [], 0
        for info in sorted(Path(folder).glob("*.dist-info")):
            dist = _norm(info.name.removesuffix(".dist-info").rsplit("-", 1)[0])
            total = 0
            for line in (info / "RECORD").read_text().splitlines():
                f = Path(folder) / line.split(",", 1)[0]
                total += f.stat().st_size if f.is_file() else 0
            dists.append(f"{dist} {total / 2**20:.1f}")
            if dist not in base:
                added += total
        already = [d.split()[0] for d in dists if d.split()[0] in base]
        print(
            f"| {name} | {du} ({apparent}) | {', '.join(dists)} | {added / 2**20:.1f} MiB | "
            f"already in the image: {', '.join(already) or 'none'} |"
        )


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.harness.store_clients", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS, help="clients to run (default: all)"
    )
    p.add_argument(
        "--client-path", action="append", default=[], metavar="NAME=DIR", help="a client's --target folder"
    )
    p.add_argument("--reps", type=int, default=5, help="runs per client (default 5)")
    p.add_argument("--model-mb", type=int, default=100, help="the model object's size (default 100 MB)")
    p.add_argument(
        "--sizes", nargs="+", metavar="NAME=DIR", help="print installed sizes instead of measuring"
    )
    p.add_argument("--base-report", type=Path, help="pip --report JSON of the serving image's extras")
    p.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    p.add_argument("--dest", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--check-put", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.dest, args.check_put)))
    elif args.sizes:
        sizes(args.sizes, args.base_report)
    else:
        measure(args)


if __name__ == "__main__":
    main()
