"""A model repository, a model config file and live-evaluation snapshots, for the rollout controller's tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.serving.model_repo import make_weights, write_manifest, write_onnx

OTHER_MODEL = 'config { name: "other" base_path: "/models/other" model_platform: "tensorflow" }'


def add_version(base: Path, version: int, seed: int | None = None) -> Path:
    """`<base>/<version>/` with model.onnx and a manifest, renamed into place as export does."""
    tmp = base / f".tmp-{version}"
    (tmp / "assets.extra").mkdir(parents=True)
    write_onnx(make_weights(version if seed is None else seed), tmp / "model.onnx")
    write_manifest(tmp, version)
    final = base / str(version)
    tmp.rename(final)
    return final


def add_broken_version(base: Path, version: int) -> Path:
    """A version whose manifest matches its files, but whose model.onnx is not a model: it fails to load."""
    tmp = base / f".tmp-{version}"
    (tmp / "assets.extra").mkdir(parents=True)
    (tmp / "model.onnx").write_bytes(b"this is not an onnx model")
    write_manifest(tmp, version)
    final = base / str(version)
    tmp.rename(final)
    return final


def corrupt(version_dir: Path) -> None:
    """Change model.onnx's bytes after the manifest was written (same size): a hash mismatch."""
    path = version_dir / "model.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def write_config(path: Path, base: Path, extra: str = "", with_other: bool = True) -> None:
    """A model config file with model ctr at `base` (no labels) and, by default, another model's entry and
    traffic line."""
    other = f"  {OTHER_MODEL}\n" if with_other else ""
    path.write_text(
        "# our models\n"
        + ("# ctr-traffic: model=other canary_percent=5\n" if with_other else "")
        + "model_config_list {\n"
        + f'  config {{ name: "ctr" base_path: "{base}" model_platform: "tensorflow" {extra}}}\n'
        + f"{other}"
        + "}\n"
    )


def fig(
    version: int, label: str, auc: float, rows: int = 2000, ratio: float = 1.0, var: float = 1e-5
) -> dict[str, Any]:
    """One snapshot figure of model ctr (the live evaluator's format, docs/live-eval.md)."""
    positives = rows // 10
    return {
        "model": "ctr",
        "version": version,
        "label": label,
        "rows": rows,
        "positives": positives,
        "pending": 0,
        "auc": auc,
        "auc_var": var,
        "logloss": 0.3,
        "ne": 0.9,
        "calibration_ratio": ratio,
        "predicted": positives * ratio,
        "observed": positives,
    }


def write_snapshot(eval_state: Path, interval: int, *figures: dict[str, Any]) -> None:
    """STATE/snapshot.json, replaced atomically as the evaluator does."""
    eval_state.mkdir(parents=True, exist_ok=True)
    tmp = eval_state / ".snapshot.tmp"
    tmp.write_text(
        json.dumps(
            {
                "interval": interval,
                "window_start": 0,
                "window_end": 1,
                "min_rows": 500,
                "figures": list(figures),
            }
        )
    )
    os.replace(tmp, eval_state / "snapshot.json")


def decisions(state_dir: Path) -> list[dict[str, Any]]:
    path = state_dir / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
