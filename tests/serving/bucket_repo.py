"""Versions published to a real bucket (SeaweedFS, tests/object_store.py) for the server's s3:// tests, and
the metrics those tests read.

A version is a small model.onnx (tests/serving/model_repo.py) and its manifest, without a warm-up file (the
server warms it up with a zero row), so making one needs no TensorFlow and takes milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ctr_contract.repository import MANIFEST_PATH
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import upload_version
from tests.serving.model_repo import make_weights, reference_predict, write_manifest, write_onnx
from tests.serving.server_process import ServerProcess, http

ROWS = np.random.default_rng(7).random((3, 128), np.float32)


def write_local_version(base: Path, version: int) -> Path:
    """`<base>/<version>/`: model.onnx with the weights of seed `version`, and its manifest."""
    folder = base / str(version)
    folder.mkdir(parents=True)
    write_onnx(make_weights(seed=version), folder / "model.onnx")
    write_manifest(folder, version)
    return folder


def publish(store: ObjectStore, base: BucketPath, version: int, local: Path, manifest: bool = True) -> Path:
    """Write version `version` under `local` and upload it as export does (the manifest last); without
    `manifest`, every object but the manifest: a version still being uploaded."""
    folder = write_local_version(local, version)
    if manifest:
        upload_version(store, base, version, folder)
    else:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_file() and rel != MANIFEST_PATH:
                store.upload(base.bucket, base.key(str(version), rel), path)
    return folder


def expected(version: int) -> list[float]:
    """What version `version` answers for ROWS (float64 reference; the server answers float32)."""
    return reference_predict(make_weights(seed=version), ROWS)[:, 0].tolist()


def predict(server: ServerProcess) -> list[float]:
    """The server's `ctr` for ROWS."""
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": ROWS.tolist()})
    assert status == 200, body
    return [row[0] for row in body["predictions"]]


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """The sum of the series of `name` whose labels include `labels` (0 when none)."""
    return metric_in(scrape(server), name, **labels)


def scrape(server: ServerProcess) -> str:
    """One /metrics page: series read from the same page are consistent with each other."""
    _, text = http(server.url("/metrics"))
    return str(text)


def metric_in(page: str, name: str, **labels: str) -> float:
    """The sum of the series of `name` in `page` whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in page.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def version_states(server: ServerProcess) -> dict[int, dict[str, object]]:
    """version -> its entry in the model status (state, status.error_code, status.error_message)."""
    _, body = http(server.url("/v1/models/ctr"))
    entries = body.get("model_version_status", []) if isinstance(body, dict) else []
    return {int(e["version"]): e for e in entries}


def corrupt_manifest(folder: Path) -> None:
    """Make the manifest list a wrong sha256 for model.onnx (the bytes uploaded are not the ones published)."""
    manifest = json.loads((folder / MANIFEST_PATH).read_text())
    manifest["files"]["model.onnx"] = "0" * 64
    (folder / MANIFEST_PATH).write_text(json.dumps(manifest))
