"""`report.md`: the machine, one table per section (medians, spread, ratios against the peer), the commands."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bench.harness.modes import SECTION_TITLES, SECTIONS
from bench.report.frameworks import framework_lines
from bench.report.measurements import baseline_label, ok_rows
from bench.report.tables import (
    TABLES,
    fmt,
    fmt_ratio,
    ratio,
    scaling_ddp_lines,
    scaling_loader_lines,
    serving_memory_table,
    table,
)
from bench.sections.serving_rollout import rollout_lines
from bench.sections.training_profile import profile_lines

PLOTS = {
    "training": ("training_throughput.png", "training throughput"),
    "inference": ("inference_latency.png", "latency percentiles per backend"),
    "serving": ("latency_vs_load.png", "latency vs load"),
    "scaling": ("data_scaling.png", "peak RSS and samples/s vs rows"),
}


def _commands(commands: Sequence[str]) -> list[str]:
    return ["Commands:", "", "```", *commands, "```"] if commands else []


def section_lines(number: int, name: str, sec: dict[str, Any], plots: set[str]) -> list[str]:
    """One section: its table and plot when measured, or FAILED with the reason."""
    lines = [f"## {number}. {SECTION_TITLES[name]}", ""]
    status = sec.get("status", "not run")
    if status != "ok":
        lines += [
            f"**{status.upper()}** after {fmt(sec.get('seconds'))} s. Reason:",
            "",
            "```",
            str(sec.get("reason", "")),
            "```",
            "",
        ]
        if sec.get("log"):
            lines += [f"Log: `{sec['log']}`", ""]
        return lines
    lines += [*TABLES[name](sec.get("rows") or []), ""]
    if name == "serving" and sec.get("instances_per_sec_batched") is not None:
        unbatched = sec.get("instances_per_sec_unbatched")
        off = f" (batching off: {fmt(unbatched)})" if unbatched is not None else ""
        batched = fmt(sec["instances_per_sec_batched"])
        lines += [
            f"With multi-instance requests, our server with batching on scored {batched} instances/s{off}.",
            "",
        ]
    if name == "serving" and sec.get("raw_ranking_rows"):
        lines += [*raw_ranking_lines(sec), ""]
    if name == "serving" and sec.get("raw_rows"):
        lines += [*raw_signature_lines(sec), ""]
    if name == "serving" and sec.get("rss_mib"):
        lines += [*serving_memory_table(sec), ""]
    if name == "serving" and sec.get("rollout"):
        lines += [*rollout_lines(sec["rollout"]), ""]
    if name == "training":
        lines += [*training_settings_lines(sec.get("rows") or []), *profile_lines(sec.get("profile") or {})]
    if name == "scaling" and sec.get("loaders"):
        lines += [*scaling_loader_lines(sec["loaders"]), ""]
    if name == "scaling" and sec.get("ddp"):
        lines += [*scaling_ddp_lines(sec["ddp"]), ""]
    if sec.get("notes"):
        lines += ["Notes:", "", *[f"- {note}" for note in sec["notes"]], ""]
    if sec.get("config"):
        lines += ["Configuration: `" + json.dumps(sec["config"], sort_keys=True) + "`", ""]
    png, alt = PLOTS[name]
    if png in plots:
        lines += [f"![{alt}]({png})", ""]
    lines += [f"Measured in {fmt(sec.get('seconds'))} s.", "", *_commands(sec.get("commands") or []), ""]
    return lines


def raw_ranking_lines(sec: dict[str, Any]) -> list[str]:
    """Ranking requests of 100 raw Criteo rows beside the same requests of 128-float vectors, same rounds."""
    vector = {r["server"]: r for r in sec.get("ranking_rows") or []}
    rows = [
        [
            r["server"],
            r["connections"],
            fmt(r["rows_per_sec"]),
            fmt(r["p99_ms"]),
            fmt(vector.get(r["server"], {}).get("qps", 0) * 100 or None),
            fmt(vector.get(r["server"], {}).get("p99_ms")),
        ]
        for r in sec["raw_ranking_rows"]
    ]
    head = ["server", "connections", "raw rows/s", "raw p99 ms", "vector rows/s", "vector p99 ms"]
    return [
        "Ranking requests of 100 rows, raw Criteo rows vs 128-float vectors (goal: raw >= 150k rows/s):",
        "",
        *table(head, rows),
    ]


def training_settings_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Which speed settings each row that reports them ran with (our pipeline's `speed:` line)."""
    return [
        line for r in rows if r.get("settings") for line in (f"{r['name']} ran with `{r['settings']}`.", "")
    ]


def raw_signature_lines(sec: dict[str, Any]) -> list[str]:
    """Our server on one raw Criteo row (the `raw` signature) beside the same server on 128 floats."""
    rows = [
        [
            r["server"],
            r["connections"],
            fmt(r["qps"]),
            fmt(r["p99_ms"]),
            fmt(r.get("features_qps")),
            fmt_ratio(ratio(r["qps"], r.get("features_qps"))),
        ]
        for r in sec["raw_rows"]
    ]
    head = ["server", "connections", "raw QPS", "raw p99 ms", "features QPS (same round)", "raw / features"]
    return [
        "Raw Criteo rows (signature `raw`; goal >= 0.9x at 8 and 64 connections):",
        "",
        *table(head, rows),
    ]


def machine_lines(machine: dict[str, Any]) -> list[str]:
    rows: list[list[Any]] = [
        ["CPU", machine.get("cpu_model")],
        ["cores", f"{machine.get('logical_cores')} logical, {machine.get('usable_cores')} usable"],
        ["memory", f"{fmt(machine.get('memory_gib'))} GiB"],
        ["OS", machine.get("os")],
        ["python", machine.get("python")],
    ]
    rows += [[k, v or "not installed"] for k, v in (machine.get("packages") or {}).items()]
    rows += [[k, v or "not installed"] for k, v in (machine.get("tools") or {}).items()]
    return ["## Machine", "", *table(["", ""], rows), ""]


def pipeline_lines(pipe: dict[str, Any]) -> list[str]:
    lines = ["## Inputs (data → train → export)", ""]
    if pipe.get("status") != "ok":
        reason = pipe.get("reason") or "not run (no section needed a model)"
        return [*lines, f"**{str(pipe.get('status', 'not run')).upper()}**:", "", "```", reason, "```", ""]
    steps = pipe.get("step_seconds") or {}
    lines += [f"Steps took {', '.join(f'{k} {fmt(v)} s' for k, v in steps.items())}."]
    m = pipe.get("train_metrics") or {}
    if m:
        lines += [
            f"The model: val AUC {fmt(m.get('val_auc'), 4)} (oracle {fmt(m.get('oracle_auc'), 4)}), val logloss {fmt(m.get('val_logloss'), 4)}."
        ]
    lines += [f"Model version: `{pipe.get('version_dir')}`.", "", *_commands(pipe.get("commands") or []), ""]
    return lines


def _training_headlines(rows: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in rows if r.get("samples_per_sec") is not None]  # not the rows that could not run
    base = baseline_label("training", [r["name"] for r in rows])
    b = next((r for r in rows if r["name"] == base), None)
    if b is None:
        return []
    return [
        f"- Training: {r['name']} at {fmt_ratio(ratio(r['samples_per_sec'], b['samples_per_sec']))} the {base} "
        f"({fmt(r['samples_per_sec'])} vs {fmt(b['samples_per_sec'])} samples/s; "
        f"val AUC {fmt(r.get('val_auc'), 4)} vs {fmt(b.get('val_auc'), 4)})."
        for r in rows
        if r is not b
    ]


def _inference_headlines(rows: list[dict[str, Any]]) -> list[str]:
    base = baseline_label("inference", [r["backend"] for r in rows])
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        at = [r for r in rows if r["batch"] == batch]
        best = min(at, key=lambda r: r["p99_ms"])
        peer = next((r for r in at if r["backend"] == base), best)
        out.append(
            f"- Inference at batch {batch}: lowest p99 is {best['backend']} ({fmt(best['p99_ms'])} ms, "
            f"{fmt_ratio(ratio(peer['p99_ms'], best['p99_ms']))} faster than {peer['backend']})."
        )
    return out


def _serving_headlines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    base = baseline_label("serving", [r["server"] for r in rows])
    top = max(r["connections"] for r in rows)
    at = [r for r in rows if r["connections"] == top]
    best = max(at, key=lambda r: r["qps"])
    peer = next((r for r in at if r["server"] == base), best)
    return [
        f"- Serving at {top} connections: {best['server']} served {fmt(best['qps'])} QPS, "
        f"{fmt_ratio(ratio(best['qps'], peer['qps']))} {peer['server']}, "
        f"p99 {fmt(best['p99_ms'])} ms vs {fmt(peer['p99_ms'])} ms."
    ]


def headline_lines(results: dict[str, Any]) -> list[str]:
    """One line per comparison the issue asks about: each peer against its section's baseline."""
    out = [
        *_training_headlines(ok_rows(results, "training")),
        *_inference_headlines(ok_rows(results, "inference")),
        *_serving_headlines(ok_rows(results, "serving")),
    ]
    return ["## Headlines", "", *out, ""] if out else []


def summary_lines(results: dict[str, Any]) -> list[str]:
    secs = results.get("sections", {})
    body = [
        [SECTION_TITLES[s], secs[s].get("status"), fmt(secs[s].get("seconds")), len(ok_rows(results, s))]
        for s in SECTIONS
        if s in secs
    ]
    return ["## Summary", "", *table(["section", "status", "seconds", "rows"], body), ""]


def render_report(results: dict[str, Any], plots: set[str]) -> str:
    """The whole report.md for a results dict; `plots` names the PNG files written beside it."""
    lines = [
        f"# ctr-pipeline bench, {results.get('started_at', '')}",
        "",
        f"Mode `{results.get('mode')}`, wall time {fmt(results.get('wall_seconds'))} s, exit code {results.get('exit_code')}. "
        "Every figure is in `results.json`; compare two runs with `make bench-compare A=dir B=dir`.",
        "",
        *framework_lines(results),
        *summary_lines(results),
        *headline_lines(results),
        *machine_lines(results.get("machine") or {}),
        *pipeline_lines(results.get("pipeline") or {}),
    ]
    for number, name in enumerate(SECTIONS, start=1):
        if name in results.get("sections", {}):
            lines += section_lines(number, name, results["sections"][name], plots)
    lines += ["## Command", "", "```", results.get("command", "python -m bench"), "```", ""]
    return "\n".join(lines)
