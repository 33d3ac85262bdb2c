"""Per-row cost of each stage of a predict, raw Criteo rows vs 128-float vectors, in-process (no HTTP).

    python -m bench.raw_stages VERSION_DIR [--rows CRITEO.csv] [--batches 1 100 256] [--repeat 5]

Each stage is the server's own function on a real body: body -> request (`decode_body` + `check_request`, what
the server runs), and the exact path's two steps apart (orjson `parse_body`; `to_request` + `check_request`),
transform + model (what a servable runs), body -> scores (decode, transform and model of a fresh batch: the
decoder's keys feed the transform), drift (`DriftMonitor.observe` of one flush's worth of distinct scored
requests, then one `flush`), encode (`encode_predictions`). Prints µs per row, the min of `--repeat` timeit
repeats. Rows: the
curl example's Criteo row with I1 varied (26 strings repeated, which flatters dict lookups), or the rows of a
Criteo CSV (`label,I1..I13,C1..C26`, empty cell = absent field) sent as clients send them.
"""

from __future__ import annotations

import argparse
import csv
import timeit
from collections.abc import Callable
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from serving.app.curl_example import CRITEO_ROW
from serving.codecs.rest_codec import encode_predictions, parse_body, to_request
from serving.dataplane.predictor import check_request
from serving.dataplane.validation import Limits
from serving.observability.drift import FLUSH_REQUESTS, FLUSH_ROWS, DriftMonitor
from serving.protocols.rest_body import decode_body
from serving.runtime.backends import load_backend
from serving.runtime.spec_backend import with_spec_transform


def criteo_rows(path: Path | None) -> list[dict[str, Any]]:
    """Rows as a client sends them: the curl example's row, or a Criteo CSV's (counts as JSON integers)."""
    if path is None:
        return [{**CRITEO_ROW, "I1": i} for i in range(256)]
    rows = []
    with path.open() as f:
        for line in csv.DictReader(f):
            row: dict[str, Any] = {k: int(float(line[k])) for k in NUMERIC_FIELDS if line[k]}
            row.update({k: line[k] for k in CATEGORICAL_FIELDS if line[k]})
            rows.append(row)
    return rows


def per_row_us(fn: Callable[[], Any], n: int, repeat: int) -> float:
    """µs per row of `fn` over a batch of `n` rows: the min of `repeat` timeit runs."""
    number = max(10, 2000 // n)
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number / n * 1e6


def stages(version_dir: Path, rows: list[dict[str, Any]], n: int, repeat: int) -> dict[str, float]:
    """µs per row of each stage at batch `n`, raw and vectors."""
    backend = with_spec_transform(load_backend("onnx", version_dir, 1), version_dir)
    sig, limits = backend.signature, Limits(10_000, False)
    body = orjson.dumps({"instances": list(islice(cycle(rows), n))})
    vbody = orjson.dumps({"instances": np.random.default_rng(0).random((n, sig.width)).round(4).tolist()})
    parsed, vparsed = parse_body(body), parse_body(vbody)
    request, vrequest = to_request(parsed, sig), to_request(vparsed, sig)
    batch, features = request.batch, vrequest.batch
    assert isinstance(batch, RawBatch) and isinstance(features, np.ndarray)
    raw_model = getattr(backend, "predict_batch", None) or (lambda b: backend.predict_raw(b.inputs))
    scores = raw_model(batch)
    ctr = sig.score(scores)
    drift = DriftMonitor("ctr", 10_000, lambda: version_dir)

    def decode() -> None:
        check_request(to_request(parsed, sig), sig, limits)

    def body_to_request() -> None:  # what the server runs on a body: the raw fast path, or parse + decode
        check_request(decode_body(body, sig, limits.max_instances)[1], sig, limits)

    def decode_fresh() -> None:  # a new batch: the keys cached on RawBatch are computed again
        raw_model(decode_body(body, sig, limits.max_instances)[1].batch)

    per_flush = min(-(-FLUSH_ROWS // n), FLUSH_REQUESTS)  # requests the server observes between two flushes
    # Distinct requests, each decoded and scored as the server does (the transform leaves its entries).
    served = [
        decode_body(
            orjson.dumps({"instances": list(islice(cycle(rows), i * n, (i + 1) * n))}),
            sig,
            limits.max_instances,
        )[1]
        for i in range(per_flush)
    ]
    for each in served:
        raw_model(each.batch)

    def observe() -> None:
        for each in served:
            drift.observe_batch(each.signature, each.batch, ctr)  # the `ctr` columns, as a runner feeds it
        drift.flush()

    def vdecode() -> None:
        check_request(to_request(vparsed, sig), sig, limits)

    return {
        "body -> request (the server's)": per_row_us(body_to_request, n, repeat),
        "orjson parse": per_row_us(lambda: parse_body(body), n, repeat),
        "decode+validate after orjson": per_row_us(decode, n, repeat),
        "transform+model": per_row_us(lambda: raw_model(batch), n, repeat),
        "body -> scores": per_row_us(decode_fresh, n, repeat),
        "drift": per_row_us(observe, n * per_flush, repeat),
        "encode": per_row_us(lambda: encode_predictions(scores, False), n, repeat),
        "vec body -> request": per_row_us(
            lambda: check_request(decode_body(vbody, sig, limits.max_instances)[1], sig, limits), n, repeat
        ),
        "vec parse": per_row_us(lambda: parse_body(vbody), n, repeat),
        "vec decode+validate": per_row_us(vdecode, n, repeat),
        "vec model": per_row_us(lambda: backend.predict(features), n, repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version_dir", type=Path, help="an exported version, e.g. artifacts/models/ctr/1")
    parser.add_argument(
        "--rows", type=Path, help="a Criteo CSV with a header (default: the curl example's row)"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 100, 256])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = criteo_rows(args.rows)
    results = {n: stages(args.version_dir, rows, n, args.repeat) for n in args.batches}
    names = list(results[args.batches[0]])
    print("| stage (µs/row) | " + " | ".join(f"batch {n}" for n in args.batches) + " |")
    print("|---|" + "---|" * len(args.batches))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{results[n][name]:.2f}" for n in args.batches) + " |")


if __name__ == "__main__":
    main()
