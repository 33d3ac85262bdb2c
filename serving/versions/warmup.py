"""Warm-up: replay `assets.extra/tf_serving_warmup_requests` (a TFRecord of PredictionLog) on a new version.

The TFRecord framing is read here without TensorFlow: each record is
`uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`, little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import numpy as np

from ctr_contract.repository import WARMUP_PATH
from serving import protos
from serving.backends import Backend
from serving.batches import RawBatch
from serving.codecs.raw_codec import decode_tensors
from serving.codecs.tensors import to_ndarray
from serving.errors import ModelLoadError
from serving.signatures import RAW_SIGNATURE

WARMUP_FILE = Path(WARMUP_PATH)
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit too


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated right by 15 and offset by 0xa282ead8.

    google-crc32c's C (SSE4.2) code: about 0.1-0.6 ms per MiB here, where a pure-Python table loop took 100-500 ms
    per MiB holding the GIL (docs/serving-versions.md).
    """
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_tfrecords(path: Path) -> Iterator[bytes]:
    """Yield each record's payload; raise ModelLoadError on truncation or a checksum mismatch."""
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ModelLoadError(f"{path}: truncated record header at byte {pos}")
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if masked_crc32c(header) != length_crc:
            raise ModelLoadError(f"{path}: corrupt length checksum at byte {pos}")
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(data):
            raise ModelLoadError(f"{path}: truncated record of {length} bytes at byte {pos}")
        payload = data[start:end]
        (payload_crc,) = struct.unpack("<I", data[end : end + 4])
        if masked_crc32c(payload) != payload_crc:
            raise ModelLoadError(f"{path}: corrupt data checksum in record at byte {pos}")
        yield payload
        pos = end + 4


def warmup_batches(version_dir: Path, input_name: str, raw: list[RawBatch] | None = None) -> list[np.ndarray]:
    """Decode the predict requests of the version's warm-up file; [] when the file is absent.

    Records for the `raw` signature are decoded into `raw` when a list is given, else skipped.
    """
    path = version_dir / WARMUP_FILE
    if not path.is_file():
        return []
    batches = []
    for i, record in enumerate(read_tfrecords(path)):
        if i >= MAX_WARMUP_RECORDS:
            raise ModelLoadError(f"{path}: more than {MAX_WARMUP_RECORDS} warm-up records")
        log = protos.PredictionLog.FromString(record)
        if log.WhichOneof("log_type") != "predict_log":
            raise ModelLoadError(f"{path}: record {i} is not a predict_log (only Predict is served)")
        inputs = log.predict_log.request.inputs
        if log.predict_log.request.model_spec.signature_name == RAW_SIGNATURE:
            if raw is not None:
                raw.append(decode_tensors(inputs))
            continue
        if input_name not in inputs:
            raise ModelLoadError(f"{path}: record {i} has inputs {sorted(inputs)}, expected '{input_name}'")
        batches.append(to_ndarray(inputs[input_name], input_name))
    return batches


def warm_up(backend: Backend, version_dir: Path) -> int:
    """Run every warm-up request (or one zero row when there is no file) and check the outputs.

    Returns:
        the number of requests replayed.
    """
    sig = backend.signature
    raw: list[RawBatch] = []
    try:
        batches = warmup_batches(version_dir, sig.input_name, raw)
    except ModelLoadError:
        raise
    except Exception as exc:  # a protobuf DecodeError, or InvalidArgument from a bad tensor
        raise ModelLoadError(f"{version_dir / WARMUP_FILE}: {exc}") from exc
    for batch in batches or [np.zeros((1, sig.width), np.float32)]:
        if batch.ndim != 2 or batch.shape[1] != sig.width:
            raise ModelLoadError(f"warm-up batch has shape {list(batch.shape)}, expected [N, {sig.width}]")
        out = backend.predict(batch)
        if out.shape != (batch.shape[0], sig.output_width) or not np.isfinite(out).all():
            raise ModelLoadError(f"warm-up output has shape {list(out.shape)} or non-finite values")
    for raw_batch in raw if sig.has_raw else []:
        out = backend.predict_raw(raw_batch.inputs)
        if out.shape != (len(raw_batch), sig.output_width) or not np.isfinite(out).all():
            raise ModelLoadError(f"raw warm-up output has shape {list(out.shape)} or non-finite values")
    return len(batches) + (len(raw) if sig.has_raw else 0)
