"""Warm-up: replay `assets.extra/tf_serving_warmup_requests` (a TFRecord of PredictionLog) on a new version.

The TFRecord framing is read here without TensorFlow: each record is
`uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`, little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import google_crc32c
import numpy as np
import orjson

from ctr_contract.repository import WARMUP_PATH
from ctr_features.compiled.raw_batch import RawBatch
from serving import protos
from serving.codecs.raw_body import client_columns, client_rows, json_can_carry
from serving.codecs.raw_codec import decode_tensors
from serving.codecs.rest_codec import decode_predict, parse_body, to_request
from serving.codecs.tensors import to_ndarray
from serving.errors import InvalidArgument, ModelLoadError
from serving.runtime.backends import Backend
from serving.runtime.spec_backend import SpecBackend
from serving.signatures import RAW_SIGNATURE

WARMUP_FILE = Path(WARMUP_PATH)
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit too
# The served raw path vs the expected scores: export's parity gate holds them within --parity-tol (1e-5 by
# default); the load allows 1e-4, so a float32 model run on another CPU's kernels still loads.
RAW_WARMUP_TOLERANCE = 1e-4


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated right by 15 and offset by 0xa282ead8.

    google-crc32c's C (SSE4.2) code: a pure-Python table loop is hundreds of times slower, and holds the GIL
    meanwhile (docs/serving-versions.md).
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


class RawWarmup(NamedTuple):
    """One `raw` warm-up record: its rows, and the outputs export recorded for them by name (`ctr`, and
    `raw_score` in versions that serve it; None in older exports)."""

    batch: RawBatch
    expected: dict[str, np.ndarray] | None


def warmup_batches(
    version_dir: Path, input_name: str, raw: list[RawWarmup] | None = None
) -> list[np.ndarray]:
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
                outputs = log.predict_log.response.outputs
                expected = {name: to_ndarray(outputs[name], name) for name in sorted(outputs)}
                raw.append(RawWarmup(decode_tensors(inputs), expected or None))
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
    raw: list[RawWarmup] = []
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
        if out.shape != (batch.shape[0], sig.columns) or not np.isfinite(out).all():
            raise ModelLoadError(f"warm-up output has shape {list(out.shape)} or non-finite values")
    replayed = len(batches) + (len(raw) if sig.has_raw else 0)
    if isinstance(backend, SpecBackend) and not raw:  # no raw records: still check the FeatureSpec path
        raw.append(RawWarmup(backend.transform.probe(), None))
    for i, record in enumerate(raw if sig.has_raw else []):
        inputs = record.batch.inputs
        out = backend.predict_raw(inputs)
        if out.shape != (len(record.batch), sig.columns) or not np.isfinite(out).all():
            raise ModelLoadError(f"raw warm-up output has shape {list(out.shape)} or non-finite values")
        _check_expected(backend, i, inputs, out, record.expected)
        if isinstance(backend, SpecBackend) and record.expected is not None:
            _check_rest_route(backend, i, record.batch, record.expected)
    return replayed


def _check_rest_route(backend: SpecBackend, i: int, rows: RawBatch, expected: dict[str, np.ndarray]) -> None:
    """The same gate on the route REST clients take: the record's rows as JSON bodies (row format, then
    columnar), decoded by both of the server's REST decoders (the native scan where it takes the body, as
    served, and the exact path alone) and transformed twice each (the native few-row transform runs once the
    first pass has cached the counts' z-scores). Rows JSON cannot carry (a count that is infinite or not
    integral) are checked by the tensor route only."""
    numeric, categorical = rows.numeric.T, rows.categorical.T
    if not json_can_carry(numeric):
        return
    signature = backend.signature
    for body in (
        orjson.dumps({"instances": client_rows(numeric, categorical)}),
        orjson.dumps({"inputs": client_columns(numeric, categorical)}),
    ):
        for decode in (
            lambda data: decode_predict(data, signature)[1],
            lambda data: to_request(parse_body(data), signature),
        ):
            try:
                batch = decode(body).batch
            except InvalidArgument as exc:
                raise ModelLoadError(
                    f"raw warm-up record {i}: the REST decoder refuses its rows: {exc.message}"
                ) from exc
            for _ in range(2):
                out = backend.predict_batch(batch)  # type: ignore[arg-type]
                _check_expected(backend, i, {}, out, expected, " sent as a REST body")


def _check_expected(
    backend: Backend,
    i: int,
    inputs: dict[str, np.ndarray],
    out: np.ndarray,
    expected: dict[str, np.ndarray] | None,
    route: str = "",
) -> None:
    """The load gate of the served raw path: its outputs on a warm-up record match the expected ones.

    Export records FeatureSpec.transform + PyTorch's outputs in each raw record, by name; an older export has
    none, and then the FeatureSpec path (serving/runtime/spec_backend.py) is checked against the version's raw
    graph instead, every output of it.
    """
    sig = backend.signature
    reference = "the scores recorded at export (FeatureSpec.transform + PyTorch)"
    if expected is None and isinstance(backend, SpecBackend):
        graph = backend.predict_raw_graph(inputs)
        expected, reference = {n: sig.output(graph, n) for n in sig.output_names}, "the version's raw graph"
    for name, want in (expected or {}).items():
        if name not in sig.output_names:
            raise ModelLoadError(
                f"raw warm-up record {i} expects output '{name}', the version serves {list(sig.output_names)}; "
                "re-export the version with this code"
            )
        got = sig.output(out, name)
        if want.shape != got.shape:
            raise ModelLoadError(
                f"raw warm-up record {i}{route} expects '{name}' of shape {list(want.shape)}, got {list(got.shape)}"
            )
        diff = float(np.max(np.abs(got.astype(np.float64) - want)))
        if not diff <= RAW_WARMUP_TOLERANCE:
            what = f"the served raw path's '{name}'" if sig.extra_outputs else "the served raw path"
            raise ModelLoadError(
                f"raw warm-up record {i}{route}: {what} differs from {reference} by {diff:.3g} "
                f"(> {RAW_WARMUP_TOLERANCE:g}); re-export the version with this code"
            )
