"""The per-section Markdown tables of report.md: medians, spread over runs, ratios against the peer row."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from bench.report.measurements import baseline_label, spread


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


def ratio(num: Any, den: Any) -> float | None:
    """num/den when both are numbers and den is non-zero, else None."""
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (num, den))
    return float(num) / float(den) if ok and den else None


def _spread_text(runs: Any) -> str:
    s = spread(runs)
    return "–" if s is None else f"{fmt(s[0])}–{fmt(s[1])}"


def _count(runs: Any) -> Any:
    return len(runs) if isinstance(runs, list) else runs if runs is not None else "–"


def training_table(rows: list[dict[str, Any]]) -> list[str]:
    """Samples/s (median and spread over runs), val AUC and the ratio to the bare PyTorch loop."""
    base = baseline_label("training", [r["name"] for r in rows])
    base_sps = next((r["samples_per_sec"] for r in rows if r["name"] == base), None)
    body, errors = [], []
    for r in rows:
        if r.get("error"):  # a framework that could not run (e.g. its venv could not be built) says why
            body.append([f"{r['name']} (error below)", "–", "–", "–", "–", "–"])
            errors += [f"**{r['name']}** could not run:", "", "```", str(r["error"]).strip(), "```", ""]
            continue
        vs_bare = r.get("ratio_vs_bare")
        if vs_bare is None:
            vs_bare = ratio(r.get("samples_per_sec"), base_sps)
        runs = r.get("samples_per_sec_runs")
        body.append(
            [
                r["name"],
                fmt(r.get("samples_per_sec")),
                _spread_text(runs),
                _count(runs),
                fmt(r.get("val_auc"), 4),
                fmt_ratio(vs_bare),
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
    return [*table(header, body), *(["", *errors] if errors else [])]


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
                fmt_ratio(ratio(peer.get("p50_ms"), r.get("p50_ms"))),
                fmt_ratio(ratio(peer.get("p99_ms"), r.get("p99_ms"))),
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
                fmt_ratio(ratio(r.get("qps"), peer.get("qps"))),
                fmt_ratio(ratio(peer.get("p99_ms"), r.get("p99_ms"))),
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


def serving_memory_table(sec: dict[str, Any]) -> list[str]:
    """Each server's resident memory (whole process group) after the load, and the request API it served."""
    rss = sec.get("rss_mib") or {}
    apis = sec.get("request_apis") or {}
    body = [[name, fmt(mib), apis.get(name, "–")] for name, mib in rss.items()]
    return table(["server", "RSS MiB after the load", "request API"], body) if body else []


def scaling_table(rows: list[dict[str, Any]]) -> list[str]:
    """Peak RSS and samples/s per (loader, processes, rows) point of the data-scaling section."""
    body = [
        [
            r["loader"],
            r["processes"],
            fmt(r["rows"]),
            fmt(r.get("peak_rss_mib")),
            fmt(r.get("samples_per_sec")),
            fmt(r.get("val_auc"), 4),
            fmt(r.get("oracle_auc"), 4),
        ]
        for r in rows
    ]
    header = [
        "loader",
        "processes",
        "rows",
        "peak RSS MiB (per process)",
        "samples/s",
        "val AUC",
        "oracle AUC",
    ]
    return table(header, body)


def scaling_ddp_lines(ddp: dict[str, Any]) -> list[str]:
    """The 2-process gloo speedup of the streaming loader."""
    return [
        f"2-process gloo DDP on {fmt(ddp.get('rows'))} rows, streamed: {fmt(ddp.get('samples_per_sec_2'))} samples/s "
        f"vs {fmt(ddp.get('samples_per_sec_1'))} with 1 process, speedup {fmt(ddp.get('speedup'))} "
        f"(the 2 processes share this machine's {ddp.get('usable_cores')} cores)."
    ]


def scaling_loader_lines(loaders: dict[str, Any]) -> list[str]:
    """Streamed ÷ in-memory samples/s: whole runs in alternating pairs, and the in-process A/B."""
    pairs = ", ".join(f"{fmt(s)} / {fmt(m)}" for s, m in loaders.get("pairs") or [])
    lo, hi = loaders.get("spread") or [None, None]
    return [
        f"Streamed ÷ in-memory on {fmt(loaders.get('rows'))} rows: **{fmt(loaders.get('stream_over_memory'))}**, the "
        f"median of {len(loaders.get('pairs') or [])} alternating pairs of whole runs (spread {fmt(lo)}–{fmt(hi)}; "
        f"stream / memory samples/s: {pairs}); in one process, alternating rounds of the pipeline's step: "
        f"{fmt(loaders.get('ab_stream_over_memory'))}."
    ]


TABLES = {
    "training": training_table,
    "inference": inference_table,
    "serving": serving_table,
    "scaling": scaling_table,
}
