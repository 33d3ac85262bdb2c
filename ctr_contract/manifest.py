"""`assets.extra/manifest.json`: the format export writes and serving checks before it loads a version.

The manifest is one JSON object. Serving relies on one key, `files`: every file of the version folder except
the manifest itself, as `{"<relative POSIX path>": "<sha256 hex>"}`. A version is complete when exactly those
files are present with those hashes. The other keys describe where the version came from (MANIFEST_KEYS).
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from ctr_contract.repository import MANIFEST_PATH

FILES_KEY = "files"
# The keys export writes, in order; `files` is the one serving reads.
MANIFEST_KEYS = (
    "version",  # the version number (the folder's name)
    "created_at",  # ISO 8601, UTC, seconds
    "source_checkpoint",  # path, sha256, epoch, global_step, model config
    "training_metrics",  # the run's metrics.json, or null
    "io",  # signatures: input/output names, dtypes and shapes
    "opset",
    "target",  # the op set the ONNX->TF translator was held to
    "op_patches",
    "parity",  # export's parity report
    "quality_gate",  # both models' figures; "forced" when --force published it
    "calibration",  # the calibrator every graph applies (its method, negative rate, knots or a, b) and its fit
    FILES_KEY,
    "export_seconds",
    "packages",  # versions of the packages that produced the files
)
SHA256_HEX_CHARS = 64
CHUNK_BYTES = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(version_dir: Path) -> dict[str, str]:
    """The `files` map of a version folder: every file but the manifest, by relative POSIX path, sorted."""
    return {
        rel: sha256_file(p)
        for p in sorted(version_dir.rglob("*"))
        if p.is_file() and (rel := p.relative_to(version_dir).as_posix()) != MANIFEST_PATH
    }


def is_listed_path(rel: str) -> bool:
    """True when `rel` may be a key of `files`: a relative path inside the version, not the manifest itself."""
    parts = PurePosixPath(rel).parts
    return bool(parts) and not PurePosixPath(rel).is_absolute() and ".." not in parts and rel != MANIFEST_PATH


def is_sha256_hex(digest: object) -> bool:
    """True when `digest` is a lowercase hex SHA-256, as `files` holds it."""
    return (
        isinstance(digest, str)
        and len(digest) == SHA256_HEX_CHARS
        and all(c in "0123456789abcdef" for c in digest)
    )
