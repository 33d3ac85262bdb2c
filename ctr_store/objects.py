"""The few object calls the stages make, each turning the store's faults into `StoreError`.

Reads stream in 1 MiB chunks straight to a file (a download holds one chunk in memory, whatever the object's
size); uploads of large files go through boto3's multipart transfer. `requests` counts the calls made, by kind,
so a poll's cost can be measured (docs/serving-versions.md).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctr_store.config import StoreConfig
from ctr_store.errors import PRECONDITION, StoreError, classify
from ctr_store.url import BucketPath

CHUNK_BYTES = 1 << 20
DELETE_BATCH = 1000  # DeleteObjects' limit


class ObjectStore:
    """One client for one process; every method is thread-safe and blocking (call it off the event loop)."""

    def __init__(self, config: StoreConfig | None = None, client: Any = None) -> None:
        self.config = config or StoreConfig.from_env()
        self._client = client if client is not None else self.config.client()
        self.requests: Counter[str] = Counter()

    def check_bucket(self, path: BucketPath) -> None:
        """One request that proves the bucket exists and the credentials may read it (HEAD bucket)."""
        self.requests["HEAD"] += 1
        try:
            self._client.head_bucket(Bucket=path.bucket)
        except Exception as exc:
            raise classify(exc, f"HEAD s3://{path.bucket}") from None

    def list_children(self, path: BucketPath) -> list[str]:
        """The names one level under `path` that hold objects ("folders"), by a delimited listing:
        one request per 1,000 names, whatever the number of objects below them."""
        prefix = f"{path.prefix}/" if path.prefix else ""
        names: list[str] = []
        token: str | None = None
        while True:
            self.requests["LIST"] += 1
            args = {"Bucket": path.bucket, "Prefix": prefix, "Delimiter": "/"}
            try:
                page = self._client.list_objects_v2(**args, **({"ContinuationToken": token} if token else {}))
            except Exception as exc:
                raise classify(exc, f"LIST {path}/") from None
            names += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", ())]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return names

    def list_objects(self, path: BucketPath) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under `path`, page by page (1,000 a request)."""
        prefix = f"{path.prefix}/" if path.prefix else ""
        token: str | None = None
        while True:
            self.requests["LIST"] += 1
            args = {"Bucket": path.bucket, "Prefix": prefix}
            try:
                page = self._client.list_objects_v2(**args, **({"ContinuationToken": token} if token else {}))
            except Exception as exc:
                raise classify(exc, f"LIST {path}/") from None
            for obj in page.get("Contents", ()):
                yield obj["Key"], int(obj["Size"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def get_bytes(self, bucket: str, key: str, max_bytes: int) -> bytes:
        """A small object whole; StoreError("not_found") when absent, ValueError beyond `max_bytes`."""
        self.requests["GET"] += 1
        what = f"GET s3://{bucket}/{key}"
        try:
            obj = self._client.get_object(Bucket=bucket, Key=key)
            if int(obj.get("ContentLength", 0)) > max_bytes:
                obj["Body"].close()
                raise ValueError(f"{what}: {obj['ContentLength']} bytes, more than the {max_bytes} allowed")
            data: bytes = obj["Body"].read(max_bytes + 1)
        except ValueError:
            raise
        except Exception as exc:
            raise classify(exc, what) from None
        if len(data) > max_bytes:
            raise ValueError(f"{what}: more than the {max_bytes} bytes allowed")
        return data

    def download(self, bucket: str, key: str, dest: Path) -> str:
        """Stream an object into `dest` (created or truncated) and return its bytes' sha256 hex."""
        self.requests["GET"] += 1
        what = f"GET s3://{bucket}/{key}"
        digest = hashlib.sha256()
        try:
            body = self._client.get_object(Bucket=bucket, Key=key)["Body"]
            with dest.open("wb") as out:
                for chunk in body.iter_chunks(CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            if dest.parent.exists() and not isinstance(exc, ConnectionError):
                raise  # our disk, not the store
            raise classify(exc, what) from None
        except Exception as exc:
            raise classify(exc, what) from None
        return digest.hexdigest()

    def upload(self, bucket: str, key: str, source: Path) -> None:
        """Upload a file (multipart beyond 8 MiB, by boto3's transfer manager)."""
        self.requests["PUT"] += 1
        try:
            self._client.upload_file(str(source), bucket, key)
        except Exception as exc:
            # boto3's transfer manager wraps the store's answer (S3UploadFailedError, with the local path in
            # its text): classify the store's own error, so that a refusal is `denied`, not `error`.
            cause = (
                exc.__context__ if type(exc).__name__ == "S3UploadFailedError" and exc.__context__ else exc
            )
            raise classify(cause, f"PUT s3://{bucket}/{key}") from None

    def put_bytes(self, bucket: str, key: str, data: bytes, if_absent: bool = False) -> bool:
        """Write a small object; with `if_absent`, only when no object has that key (`If-None-Match: *`):
        False when one does, so two writers never both win."""
        self.requests["PUT"] += 1
        try:
            self._client.put_object(
                Bucket=bucket, Key=key, Body=data, **({"IfNoneMatch": "*"} if if_absent else {})
            )
        except Exception as exc:
            err = classify(exc, f"PUT s3://{bucket}/{key}")
            if if_absent and err.reason == PRECONDITION:
                return False
            raise err from None
        return True

    def delete(self, bucket: str, keys: list[str]) -> None:
        """Delete objects, 1,000 a request; a key already gone is not an error."""
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            self.requests["DELETE"] += 1
            try:
                out = self._client.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            except Exception as exc:
                raise classify(exc, f"DELETE s3://{bucket}/{batch[0]} (+{len(batch) - 1})") from None
            if out.get("Errors"):
                first = out["Errors"][0]
                raise StoreError(
                    "error",
                    f"DELETE s3://{bucket}/{first.get('Key')}: {first.get('Code')}: {first.get('Message')}",
                )
