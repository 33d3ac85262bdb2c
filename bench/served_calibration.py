"""How calibrated the served probabilities are on fresh rows of the built-in world, scored through our server.

    python -m bench.served_calibration MODEL_BASE_PATH [--rows 40000] [--seed 11] [--day 0] [--out FILE.json]

Writes `--rows` new rows of the synthetic world (`training.synth`, a sampling seed training did not use; the same
click model), starts our server on 127.0.0.1 over MODEL_BASE_PATH, sends the rows as raw Criteo instances
(`/v1/models/ctr:predict`, the `raw` signature) in requests of `--batch` rows, and prints the served
probabilities' AUC, log loss, ECE and calibration ratio (mean predicted ÷ observed clicks) as JSON. Memory holds
one request's rows and one float per row scored.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.harness import procs
from bench.harness.servers import base_path_of, our_server
from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.data.criteo import read_batches
from ctr_model.metrics import calibration_ratio, expected_calibration_error, log_loss, roc_auc


def instances(table: pa.Table) -> list[dict[str, Any]]:
    """A batch's rows as raw instances: missing numbers and empty strings are left out, as a client would."""
    columns = {f: table.column(f).to_pylist() for f in (*NUMERIC_FIELDS, *CATEGORICAL_FIELDS)}
    rows: list[dict[str, Any]] = []
    for i in range(len(table)):
        row: dict[str, Any] = {}
        for f, values in columns.items():
            v = values[i]
            if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
                continue
            row[f] = v
        rows.append(row)
    return rows


def score(url: str, data: Path, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row of `data` through the server: (labels, served probabilities)."""
    labels: list[np.ndarray] = []
    probs: list[np.ndarray] = []
    for record_batch in read_batches(data):
        table = pa.Table.from_batches([record_batch])
        for start in range(0, len(table), batch):
            part = table.slice(start, batch)
            body = json.dumps({"instances": instances(part)}).encode()
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
            probs.append(np.asarray(answer["predictions"], dtype=np.float64).reshape(-1))
            labels.append(part.column(LABEL).to_numpy().astype(np.float64))
    return np.concatenate(labels), np.concatenate(probs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.served_calibration", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "model_base_path", type=Path, help="the model base path (.../ctr) or the repository above it"
    )
    parser.add_argument("--rows", type=int, default=40_000, help="fresh rows to score (default 40000)")
    parser.add_argument(
        "--seed", type=int, default=11, help="their sampling seed (default 11; training uses 7)"
    )
    parser.add_argument(
        "--day", type=float, default=0, help="the world's day (default 0, the built-in data's)"
    )
    parser.add_argument("--batch", type=int, default=500, help="rows per request (default 500)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    from training.synth import generate

    with tempfile.TemporaryDirectory(prefix="served-calibration-") as tmp:
        data = Path(tmp) / "fresh.txt"
        generate(data, args.rows, args.seed, day=args.day)
        server = our_server("ours", base_path_of(args.model_base_path), batching=False)
        try:
            server.start(Path(tmp), [])
            labels, probs = score(server.url, data, args.batch)
        finally:
            procs.stop_all()
    figures = {
        "rows": len(labels),
        "seed": args.seed,
        "day": args.day,
        "auc": roc_auc(labels, probs),
        "logloss": log_loss(labels, probs),
        "ece": expected_calibration_error(labels, probs),
        "calibration_ratio": calibration_ratio(labels, probs),
        "mean_predicted_ctr": float(probs.mean()),
        "observed_ctr": float(labels.mean()),
    }
    text = json.dumps(figures, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
