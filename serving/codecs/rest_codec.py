"""TF Serving's REST predict body ⇄ numpy: row (`instances`) and columnar (`inputs`) formats.

The happy path is one `orjson.loads` (much faster than `json` on lists of floats) and one `np.asarray`; raw rows
are scanned natively first (`decode_raw_body`, with the scan of serving/codecs/raw_body.py), and a body the scan
declines is parsed by orjson and decoded by the exact path (serving/codecs/raw_codec.py). The per-value Python
walk in `_diagnose` runs only to explain an error (which instance, which feature, what was expected).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ctr_features.compiled.raw_batch import RawBatch
from serving.codecs import raw_body
from serving.codecs.raw_codec import decode_rest, looks_raw
from serving.codecs.v2_codec import check_text
from serving.errors import InvalidArgument
from serving.requests import DecodedRequest
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature


@dataclass(frozen=True)
class PredictBody:
    """A parsed predict request: the raw rows, the format, and the requested signature."""

    rows: Any  # list of rows (row format) or the columnar value
    columnar: bool
    signature_name: str
    may_hold_booleans: bool = False  # the body has a `true` or `false` token (or those letters in a string)
    signature_given: bool = False  # the body names a signature (else `raw` is picked by the rows' keys)


def decode_predict(body: bytes | bytearray, sig: Signature) -> tuple[bool, DecodedRequest]:
    """A predict body for `sig` -> (columnar format?, the decoded request); raises InvalidArgument naming the
    bad instance. Raw rows go straight to columns (`decode_raw_body`) when they can."""
    # Raw rows are objects: a body with no '{' after its first byte near the start is vectors (not worth a
    # scan); a body that only looks raw is declined by the scan itself.
    if sig.has_raw and body.find(b"{", 1, 256) > 0 and raw_body.scan is not None:
        # decode_raw_body's steps, inline: a frame and a tuple fewer a request
        found = raw_body.scan(body, 1, raw_body.MAX_SCAN_ROWS)
        if found is not None:
            return found[0], DecodedRequest(RAW_SIGNATURE, RawBatch.of_scan(found[1], found[2]))
    request = parse_body(body)
    return request.columnar, to_request(request, sig)


def decode_raw_body(body: bytes | bytearray) -> tuple[bool, RawBatch] | None:
    """A raw REST body -> (columnar format?, its RawBatch), or None: the exact path's to decode. The native scan
    (serving/codecs/raw_body.py) takes row and columnar bodies of its JSON subset, and its keys are the batch's.
    `decode_predict` takes the same steps inline."""
    scan = raw_body.scan  # the counts float64 (13, n) and keys uint64 (26, n), as numpy arrays
    if scan is None:
        return None
    found = scan(body, 1, raw_body.MAX_SCAN_ROWS)
    if found is None:
        return None
    return found[0], RawBatch.of_scan(found[1], found[2])


def parse_body(body: bytes | bytearray) -> PredictBody:
    """Parse the JSON envelope; the rows are converted later, once the version's signature is known."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        # orjson rejects the NaN/Infinity literals TF Serving accepts; the stdlib parser takes them, so the
        # NaN check can name the value (or --allow_nonfinite let it through).
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise InvalidArgument(f"malformed JSON body: {exc}") from exc
        except RecursionError as exc:  # e.g. 10,000 nested '[': orjson stops at 1024 levels, json recurses
            raise InvalidArgument("malformed JSON body: nested too deeply") from exc
    if not isinstance(doc, dict):
        raise InvalidArgument(f"the body must be a JSON object, got {type(doc).__name__}")
    signature_given = "signature_name" in doc
    signature_name = doc.get("signature_name", DEFAULT_SIGNATURE)
    if signature_name not in (DEFAULT_SIGNATURE, RAW_SIGNATURE):
        if isinstance(signature_name, str):  # echoed in the answer: UTF-8 first
            check_text(signature_name, "'signature_name'")
        raise InvalidArgument(f'Serving signature name: "{signature_name}" not found in signature def')
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise InvalidArgument("the body has both 'instances' and 'inputs'; send one (row or columnar format)")
    if not has_instances and not has_inputs:
        raise InvalidArgument(
            f"the body is missing 'instances' (row format) or 'inputs' (columnar format); keys: {sorted(doc)}"
        )
    # np.asarray turns `true` among numbers into 1.0, so booleans need a look of their own; a byte search
    # (~10 GB/s) spares the per-value walk for every body without the letters.
    may_hold_booleans = b"true" in body or b"false" in body
    rows = doc["instances"] if has_instances else doc["inputs"]
    return PredictBody(rows, not has_instances, signature_name, may_hold_booleans, signature_given)


def to_request(body: PredictBody, sig: Signature) -> DecodedRequest:
    """Convert the rows to float32 (N, F) features, or to a RawBatch for the `raw` signature.

    `raw` is chosen by `signature_name`, or when none is given and the rows carry raw Criteo field names.
    Raises InvalidArgument naming the bad instance; an empty batch is left to validation.
    """
    name = sig.input_name
    if body.signature_name == RAW_SIGNATURE or (
        not body.signature_given and looks_raw(body.rows, body.columnar, name)
    ):
        if not sig.has_raw:
            raise InvalidArgument(
                f'Serving signature name: "{RAW_SIGNATURE}" not found in signature def; this version was '
                f"exported before raw serving: send '{name}' or re-export it"
            )
        return DecodedRequest(RAW_SIGNATURE, decode_rest(body.rows, body.columnar))
    rows = body.rows
    if body.columnar and isinstance(rows, dict):
        if set(rows) != {name}:
            raise InvalidArgument(f"'inputs' has keys {sorted(rows)}, expected exactly ['{name}']")
        rows = rows[name]
    if not isinstance(rows, list):
        key = "inputs" if body.columnar else "instances"
        raise InvalidArgument(
            f"'{key}' must be a list of {sig.width}-number lists, got {type(rows).__name__}"
        )
    if rows and isinstance(rows[0], dict) and not body.columnar:
        rows = [_named_row(inst, i, name) for i, inst in enumerate(rows)]
    if not rows:
        return DecodedRequest(DEFAULT_SIGNATURE, np.empty((0, sig.width), np.float32))
    try:
        array = np.asarray(rows)
    except ValueError:  # ragged lists
        array = None
    if array is None or array.dtype.kind not in "iuf" or array.ndim != 2 or array.shape[1] != sig.width:
        raise InvalidArgument(_diagnose(rows, sig.width))
    if body.may_hold_booleans and any(v is True or v is False for row in rows for v in row):
        # _diagnose names the first boolean, as it does for an all-boolean row (which np.asarray keeps bool).
        raise InvalidArgument(_diagnose(rows, sig.width))
    return DecodedRequest(DEFAULT_SIGNATURE, array.astype(np.float32, copy=False))


def _named_row(instance: Any, i: int, name: str) -> Any:
    if not isinstance(instance, dict) or set(instance) != {name}:
        got = sorted(instance) if isinstance(instance, dict) else type(instance).__name__
        raise InvalidArgument(f"instance {i} must be an object with exactly the key '{name}', got {got}")
    return instance[name]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """`value` as JSON, cut to 40 characters, for an error message."""
    try:
        return json.dumps(value)[:40]
    except RecursionError:  # orjson parses up to 1024 levels; json.dumps stops near 1000
        return f"a deeply nested {type(value).__name__}"


def _diagnose(rows: list[Any], width: int) -> str:
    """Explain why `rows` is not a numeric (N, width) batch, naming the first offending instance."""
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            return f"instance {i} is {_shown(row)} ({type(row).__name__}), expected a list of {width} numbers"
        if len(row) != width:
            return f"expected {width} features per instance, got {len(row)} in instance {i}"
        for j, value in enumerate(row):
            if not _is_number(value):
                return (
                    f"instance {i} feature {j} is {_shown(value)} ({type(value).__name__}), expected a number"
                )
    return f"instances must be lists of {width} numbers"


def encode_predictions(scores: np.ndarray, columnar: bool) -> bytes:
    """(N, K) scores -> `{"predictions": [[p], ...]}` (row) or `{"outputs": [[p], ...]}` (columnar)."""
    # orjson writes float32 with its shortest repr (0.5494658), as TF Serving does.
    return orjson.dumps({"outputs" if columnar else "predictions": scores}, option=orjson.OPT_SERIALIZE_NUMPY)
