"""`report.md`: the machine, one table per section (medians, spread, ratios against the peer), the commands."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from bench.figures import baseline_label, ok_rows, spread
from bench.modes import SECTION_TITLES, SECTIONS

PLOTS = {
    "training": ("training_throughput.png", "training throughput"),
    "inference": ("inference_latency.png", "latency percentiles per backend"),
    "serving": ("latency_vs_load.png", "latency vs load"),
}


def fmt(value: Any, digits: int = 3) -> str:
    """A figure for a table: thousands separators for big numbers, `digits` significant for small ones."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def _ratio(num: Any, den: Any) -> float | None:
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (num, den))
    return float(num) / float(den) if ok and den else None


def _spread_text(runs: Any) -> str:
    s = spread(runs)
    return "–" if s is None else f"{fmt(s[0])}–{fmt(s[1])}"


def _count(runs: Any) -> Any:
    return len(runs) if isinstance(runs, list) else runs if runs is not None else "–"


def _commands(commands: Sequence[str]) -> list[str]:
    return ["Commands:", "", "```", *commands, "```"] if commands else []


def training_table(rows: list[dict[str, Any]]) -> list[str]:
    """Samples/s (median and spread over runs), val AUC and the ratio to the bare PyTorch loop."""
    base = baseline_label("training", [r["name"] for r in rows])
    base_sps = next((r["samples_per_sec"] for r in rows if r["name"] == base), None)
    body = []
    for r in rows:
        ratio = r.get("ratio_vs_bare")
        if ratio is None:
            ratio = _ratio(r.get("samples_per_sec"), base_sps)
        runs = r.get("samples_per_sec_runs")
        body.append(
            [
                r["name"],
                fmt(r.get("samples_per_sec")),
                _spread_text(runs),
                _count(runs),
                fmt(r.get("val_auc"), 4),
                fmt_ratio(ratio),
            ]
        )
    header = [
        "pipeline",
        "samples/s (median)",
        "spread (min–max)",
        "runs",
        "val AUC",
        f"× {base or 'bare loop'}",
    ]
    return table(header, body)


def inference_table(rows: list[dict[str, Any]]) -> list[str]:
    """p50/p99 per backend and batch, and each backend's speed-up over PyTorch eager at the same batch."""
    base = baseline_label("inference", [r["backend"] for r in rows])
    base_by_batch = {r["batch"]: r for r in rows if r["backend"] == base}
    body = []
    for r in sorted(rows, key=lambda r: r["batch"]):  # stable: keeps the module's backend order
        peer = base_by_batch.get(r["batch"], {})
        body.append(
            [
                r["backend"],
                r["batch"],
                fmt(r.get("p50_ms")),
                fmt(r.get("p99_ms")),
                _spread_text(r.get("p50_ms_runs")),
                _spread_text(r.get("p99_ms_runs")),
                _count(r.get("runs")),
                fmt_ratio(_ratio(peer.get("p50_ms"), r.get("p50_ms"))),
                fmt_ratio(_ratio(peer.get("p99_ms"), r.get("p99_ms"))),
            ]
        )
    peer_name = base or "baseline"
    header = [
        "backend",
        "batch",
        "p50 ms",
        "p99 ms",
        "p50 spread",
        "p99 spread",
        "runs",
        f"p50 speed-up vs {peer_name}",
        f"p99 speed-up vs {peer_name}",
    ]
    return table(header, body)


def serving_table(rows: list[dict[str, Any]]) -> list[str]:
    """QPS and latency percentiles per server and connection count, with ratios to the naive server."""
    base = baseline_label("serving", [r["server"] for r in rows])
    base_by_conn = {r["connections"]: r for r in rows if r["server"] == base}
    body = []
    order = {s: i for i, s in enumerate(dict.fromkeys(r["server"] for r in rows))}
    for r in sorted(rows, key=lambda r: (order[r["server"]], r["connections"])):
        peer = base_by_conn.get(r["connections"], {})
        body.append(
            [
                r["server"],
                r["connections"],
                fmt(r.get("qps")),
                fmt(r.get("p50_ms")),
                fmt(r.get("p90_ms")),
                fmt(r.get("p99_ms")),
                fmt_ratio(_ratio(r.get("qps"), peer.get("qps"))),
                fmt_ratio(_ratio(peer.get("p99_ms"), r.get("p99_ms"))),
                fmt(r.get("errors", 0)),
            ]
        )
    peer_name = base or "baseline"
    header = [
        "server",
        "connections",
        "QPS",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        f"QPS × {peer_name}",
        f"p99 speed-up vs {peer_name}",
        "errors",
    ]
    return table(header, body)


TABLES = {"training": training_table, "inference": inference_table, "serving": serving_table}


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
    if sec.get("notes"):
        lines += ["Notes:", "", *[f"- {note}" for note in sec["notes"]], ""]
    if sec.get("config"):
        lines += ["Configuration: `" + json.dumps(sec["config"], sort_keys=True) + "`", ""]
    png, alt = PLOTS[name]
    if png in plots:
        lines += [f"![{alt}]({png})", ""]
    lines += [f"Measured in {fmt(sec.get('seconds'))} s.", "", *_commands(sec.get("commands") or []), ""]
    return lines


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
        *summary_lines(results),
        *machine_lines(results.get("machine") or {}),
        *pipeline_lines(results.get("pipeline") or {}),
    ]
    for number, name in enumerate(SECTIONS, start=1):
        if name in results.get("sections", {}):
            lines += section_lines(number, name, results["sections"][name], plots)
    lines += ["## Command", "", "```", results.get("command", "python -m bench"), "```", ""]
    return "\n".join(lines)
