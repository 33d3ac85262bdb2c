"""Score the static, the online and the oracle model on each interval's *next* interval of traffic.

For interval j: the static model is version 1 (trained before the traffic started), the online model is the
newest version published by the time interval j was finished (what the servers served during interval j+1),
the oracle is the world's true click probability of each row (the simulator's --truth-dir). All three are
scored on every joined row of interval j+1 (training and held-out partitions), which no model trained on yet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ctr_contract.repository import FEATURE_SPEC_PATH, ONNX_MODEL
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.spec import FeatureSpec
from ctr_model.metrics import roc_auc
from pipelines.clicks.join import partition_name


def read_truth(folder: Path) -> dict[str, list[float]]:
    """request id -> true click probability per instance."""
    truth: dict[str, list[float]] = {}
    for path in sorted(folder.glob("truth-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                entry = json.loads(line)
                truth[entry["request_id"]] = entry["p"]
    return truth


def interval_rows(data: Path, interval: int) -> pa.Table | None:
    """Every joined row of one interval (training and held-out), or None when it has none."""
    parts = [data / kind / partition_name(interval) for kind in ("train", "holdout")]
    tables = [pq.read_table(p) for p in parts if p.is_file()]
    return pa.concat_tables(tables) if tables else None


def score_version(version_dir: Path, table: pa.Table) -> np.ndarray:
    """One published version's click probabilities for the rows, through its own feature spec and model.onnx."""
    from export.gates.runtimes import onnxruntime_predictor

    num = np.stack([table.column(f).to_numpy(zero_copy_only=False) for f in NUMERIC_FIELDS], 1).astype(
        np.float64
    )
    cat = np.stack([np.asarray(table.column(f).to_pylist(), object) for f in CATEGORICAL_FIELDS], 1)
    features = FeatureSpec.load(version_dir / FEATURE_SPEC_PATH).transform(num, cat)
    return np.asarray(onnxruntime_predictor(version_dir / ONNX_MODEL)(features)).reshape(-1)


def evaluate(data: Path, repo: Path, truth_dir: Path, outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per finished interval j with a next interval: AUCs of static v1, the online model and the oracle on j+1."""
    truth = read_truth(truth_dir)
    served, rows = 1, []
    for o in outcomes:
        if o["outcome"] == "published":
            served = int(o["version"])
        table = interval_rows(data, o["interval"] + 1)
        if table is None or len(table) < 50:
            continue
        labels = table.column("label").to_numpy().astype(np.float64)
        if labels.min() == labels.max():
            continue
        ids, inst = table.column("request_id").to_pylist(), table.column("instance").to_pylist()
        oracle = np.array([truth.get(r, [np.nan] * (i + 1))[i] for r, i in zip(ids, inst, strict=True)])
        static_auc = roc_auc(labels, score_version(repo / "1", table))
        online_auc = static_auc if served == 1 else roc_auc(labels, score_version(repo / str(served), table))
        known = ~np.isnan(oracle)
        rows.append(
            {
                "interval": o["interval"],
                "outcome": o["outcome"],
                "online_version": served,
                "next_interval_rows": len(table),
                "static_auc": round(static_auc, 4),
                "online_auc": round(online_auc, 4),
                "oracle_auc": round(roc_auc(labels[known], oracle[known]), 4) if known.sum() > 50 else None,
            }
        )
    return rows
