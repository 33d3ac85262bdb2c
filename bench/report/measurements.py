"""Every figure of a bench run under a stable name, and the peer each section is compared against.

Names look like `training/<name>/samples_per_sec`, `inference/<backend>/batch=64/p99_ms` and
`serving/<server>/c=8/qps`; `bench.compare` matches two runs on them.
"""

from __future__ import annotations

from typing import Any

# Row fields holding the figures of each section, and the fields that name a row.
TRAINING_FIELDS = ("samples_per_sec", "val_auc")
INFERENCE_FIELDS = ("p50_ms", "p99_ms")
SERVING_FIELDS = ("qps", "p50_ms", "p90_ms", "p99_ms")

# Substrings (lower case) that pick each section's baseline row, in order of preference.
BASELINES = {
    "training": ("bare",),
    "inference": ("eager",),
    "serving": ("fastapi", "naive"),
}


def ok_rows(results: dict[str, Any], section: str) -> list[dict[str, Any]]:
    """The rows of a section that was measured; [] when it failed or did not run."""
    sec = results.get("sections", {}).get(section) or {}
    if sec.get("status") != "ok":
        return []
    return list(sec.get("rows") or [])


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def flatten(results: dict[str, Any]) -> dict[str, float]:
    """Every numeric figure of a run, keyed by its stable name."""
    out: dict[str, float] = {}
    for row in ok_rows(results, "training"):
        for f in TRAINING_FIELDS:
            if (v := _number(row.get(f))) is not None:
                out[f"training/{row['name']}/{f}"] = v
    for f, v in ddp_figures(results).items():
        out[f"scaling/ddp/{f}"] = v
    loaders = (results.get("sections", {}).get("scaling") or {}).get("loaders") or {}
    for f in ("stream_over_memory", "ab_stream_over_memory"):
        if (v := _number(loaders.get(f))) is not None:
            out[f"scaling/loaders/{f}"] = v
    for row in ok_rows(results, "inference"):
        for f in INFERENCE_FIELDS:
            if (v := _number(row.get(f))) is not None:
                out[f"inference/{row['backend']}/batch={row['batch']}/{f}"] = v
    for row in ok_rows(results, "serving"):
        for f in SERVING_FIELDS:
            if (v := _number(row.get(f))) is not None:
                out[f"serving/{row['server']}/c={row['connections']}/{f}"] = v
    serving = results.get("sections", {}).get("serving") or {}
    for f in (
        "instances_per_sec_batched",
        "instances_per_sec_unbatched",
        "raw_instances_per_sec_batched",
        "raw_instances_per_sec_unbatched",
    ):
        if serving.get("status") == "ok" and (v := _number(serving.get(f))) is not None:
            out[f"serving/{f}"] = v
    return out


def ddp_figures(results: dict[str, Any]) -> dict[str, float]:
    """1- and 2-process gloo samples/s of the scaling section, and the DDP efficiency (2-process ÷ 2 × 1-process)."""
    sec = results.get("sections", {}).get("scaling") or {}
    ddp = (sec.get("ddp") or {}) if sec.get("status") == "ok" else {}
    one, two = _number(ddp.get("samples_per_sec_1")), _number(ddp.get("samples_per_sec_2"))
    if one is None or two is None or one <= 0:
        return {}
    return {"samples_per_sec_1": one, "samples_per_sec_2": two, "efficiency": two / (2 * one)}


def higher_is_better(name: str) -> bool:
    """Latencies (`*_ms`) are better lower; throughputs and AUC are better higher."""
    return not name.endswith("_ms")


def baseline_label(section: str, labels: list[str]) -> str | None:
    """The label of the section's peer row (bare PyTorch, PyTorch eager, naive FastAPI), if present."""
    for needle in BASELINES[section]:
        for label in labels:
            if needle in label.lower():
                return label
    return None


def spread(runs: Any) -> tuple[float, float] | None:
    """(min, max) over the repeated runs of a figure, or None when fewer than two were recorded."""
    values = [v for v in (_number(r) for r in runs or []) if v is not None] if isinstance(runs, list) else []
    if len(values) < 2:
        return None
    return min(values), max(values)
