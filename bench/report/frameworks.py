"""The table report.md opens with: each framework × (training samples/s, val AUC, inference p99 at batch 1,
serving QPS), every cell taken from this run's sections, each row with the versions it ran.

A cell is a figure, `n/a` (the framework has no such row in the bench), `–` (the run left its section out),
or a short word whose reason is listed under the table: `error` (the row ran and failed), `not run` (its venv or server could not start),
`failed` (the whole section failed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.peers.jax_forward import BACKEND as JAX_INFERENCE
from bench.report.measurements import ddp_figures, ok_rows
from bench.report.tables import fmt, table
from bench.sections.serving_load import KSERVE, NAIVE, OURS_ON, TORCHSERVE
from bench.sections.training_throughput import FOREIGN, WORKERS

# Row labels of the training section.
BARE, OURS_TRAIN, KERAS = WORKERS["bare"], WORKERS["ours"], WORKERS["keras"]
JAX_TRAIN, MLX_TRAIN = FOREIGN["jax"], FOREIGN["mlx"]


@dataclass(frozen=True)
class Framework:
    """Which row of each section stands for one framework (None: it has none), and its packages."""

    name: str
    training: str | None
    inference: str | None
    serving: str | None
    packages: tuple[str, ...]


FRAMEWORKS = (
    Framework("PyTorch (bare loop, eager, FastAPI)", BARE, "PyTorch eager", NAIVE, ("torch",)),
    Framework(
        "PyTorch + Lightning → ONNX Runtime (ours)",
        OURS_TRAIN,
        "ONNX Runtime",
        OURS_ON,
        ("torch", "lightning", "onnxruntime"),
    ),
    Framework("TF / Keras", KERAS, "TF SavedModel", None, ("tensorflow", "keras")),
    Framework("JAX + Flax", JAX_TRAIN, JAX_INFERENCE, None, ("jax", "flax", "optax")),
    Framework("MLX (CPU)", MLX_TRAIN, None, None, ("mlx",)),
    Framework("TorchServe (TorchScript)", None, "TorchScript", TORCHSERVE, ("torchserve", "torch")),
    Framework("KServe (ONNX Runtime)", None, None, KSERVE, ("kserve",)),  # its own venv: no main-venv ORT
)
HEADER = ["framework", "versions", "train samples/s", "val AUC", "inference p99 ms (batch 1)", "serving QPS"]


def _status(results: dict[str, Any], section: str) -> str:
    return str((results.get("sections", {}).get(section) or {}).get("status", "not run"))


def _note_for(results: dict[str, Any], section: str, label: str) -> str | None:
    """The section's note about `label`: the first one starting with its first word ('kserve skipped: ...')."""
    notes = (results.get("sections", {}).get(section) or {}).get("notes") or []
    word = label.split()[0].lower()
    return next((str(n) for n in notes if str(n).lower().startswith(word)), None)


def _versions(fw: Framework, rows: list[dict[str, Any]], results: dict[str, Any]) -> str:
    """Versions the rows report themselves (foreign venvs), else the main venv's (results["machine"])."""
    found: dict[str, str] = {}
    for row in rows:
        found |= {k: str(v) for k, v in (row.get("versions") or {}).items()}
    packages = (results.get("machine") or {}).get("packages") or {}
    serving = results.get("sections", {}).get("serving") or {}
    found |= {k: str(v) for k, v in ((serving.get("versions") or {}).get(fw.serving or "") or {}).items()}
    for name in fw.packages:
        if name not in found and packages.get(name):
            found[name] = str(packages[name])
        kserve = packages.get("kserve (.venv-kserve)")
        if name == "kserve" and name not in found and kserve:
            found[name] = str(kserve)
    return ", ".join(f"{k} {found[k]}" for k in fw.packages if k in found) or "–"


def framework_lines(results: dict[str, Any]) -> list[str]:
    """`## Frameworks`: the table and, under it, the reason for every cell that holds no figure."""
    reasons: list[str] = []
    training = {r["name"]: r for r in ok_rows(results, "training")}
    inference = {r["backend"]: r for r in ok_rows(results, "inference") if r.get("batch") == 1}
    serving_rows = ok_rows(results, "serving")
    top = max((r["connections"] for r in serving_rows), default=None)
    serving = {r["server"]: r for r in serving_rows if r["connections"] == top}

    def cell(
        fw: Framework, section: str, label: str | None, found: dict[str, Any], field: str, digits: int = 3
    ) -> str:
        if label is None:
            return "n/a"
        if section not in results.get("sections", {}):
            reasons.append(f"{section}: not measured in this run (`--sections` left it out)")
            return "–"
        if _status(results, section) != "ok":
            reasons.append(f"{fw.name}, {section}: the section {_status(results, section)}")
            return _status(results, section)
        row = found.get(label)
        if row is None:
            reasons.append(
                f"{fw.name}, {section}: {_note_for(results, section, label) or 'no row in this run'}"
            )
            return "not run"
        if row.get("error"):
            if field == "samples_per_sec":  # one reason per row, not one per column
                reasons.append(f"{fw.name}, {section}: {str(row['error']).strip()}")
            return "error"
        return fmt(row.get(field), digits)

    body = []
    for fw in FRAMEWORKS:
        rows = [r for r in (training.get(fw.training or ""), inference.get(fw.inference or "")) if r]
        body.append(
            [
                fw.name,
                _versions(fw, rows, results),
                cell(fw, "training", fw.training, training, "samples_per_sec"),
                cell(fw, "training", fw.training, training, "val_auc", 4),
                cell(fw, "inference", fw.inference, inference, "p99_ms"),
                cell(fw, "serving", fw.serving, serving, "qps"),
            ]
        )
    header = [*HEADER[:-1], f"serving QPS ({top} connections)" if top else HEADER[-1]]
    lines = ["## Frameworks", "", *table(header, body), ""]
    # One reason per (framework, section): the two training columns share theirs.
    unique = list(dict.fromkeys(reasons))
    if unique:
        lines += ["Cells without a figure:", "", *[f"- {r.splitlines()[0]}" for r in unique], ""]
    ddp = ddp_figures(results)
    if ddp:
        cores = ((results.get("sections", {}).get("scaling") or {}).get("ddp") or {}).get("usable_cores")
        lines += [
            f"DDP (gloo, measured in the scaling section): 1 process {fmt(ddp['samples_per_sec_1'])} samples/s, "
            f"2 processes {fmt(ddp['samples_per_sec_2'])} samples/s, efficiency {fmt(ddp['efficiency'])} "
            f"(2-process ÷ (2 × 1-process)). On this {cores}-core machine the two processes share the cores, "
            "so this is the cost of DDP on one box, not the gain of a second one.",
            "",
        ]
    lines += [
        "Every figure was measured in this run: training in the training section (same data, MLP, Adam, batch "
        "and epochs), p99 in-process at batch 1, QPS with single-instance requests; the sections below hold "
        "the details, spreads and commands.",
        "",
    ]
    return lines
