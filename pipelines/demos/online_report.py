"""The online demo's report: results.json (everything) and report.md (the tables and the goals)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def freshness(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per published version: from the first possible click on its interval's rows to the server serving it."""
    out = []
    s = results["interval_s"]
    for o in results["outcomes"]:
        served = results["served_at"].get(str(o.get("version")))
        if o["outcome"] != "published" or served is None:
            continue
        start = o["interval"] * s
        out.append(
            {
                "interval": o["interval"],
                "version": o["version"],
                "click_to_served_s": round(served - start, 1),
                "intervals": round((served - start) / s, 2),
            }
        )
    return out


def goals(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals, measured."""
    rows, s = results["intervals"], results["interval_s"]
    fresh = results["freshness"]
    trained = [o for o in results["outcomes"] if o["outcome"] in ("published", "refused")]
    last = rows[-1] if rows else None
    worst = min((r["online_auc"] - r["static_auc"] for r in rows), default=None)
    return {
        "last_interval_online_minus_static": None
        if last is None
        else round(last["online_auc"] - last["static_auc"], 4),
        "online_beats_static_by_0.02_at_the_end": last is not None
        and last["online_auc"] - last["static_auc"] >= 0.02,
        "worst_online_minus_static": None if worst is None else round(worst, 4),
        "never_worse_than_static_by_more_than_0.002": worst is not None and worst >= -0.002,
        "max_click_to_served_intervals": max((f["intervals"] for f in fresh), default=None),
        "freshness_within_2_intervals": bool(fresh) and max(f["intervals"] for f in fresh) <= 2,
        "max_interval_seconds": max((o["seconds"] for o in trained), default=None),
        "keeps_up_at_demo_rate": bool(trained) and max(o["seconds"] for o in trained) < s,
        "ten_x_interval_seconds": _ten_x_seconds(results),
        "keeps_up_at_10x": (_ten_x_seconds(results) or s) < s,
    }


def _ten_x_seconds(results: dict[str, Any]) -> float | None:
    t = results.get("ten_x") or {}
    if not t.get("train_s"):
        return None
    return round(t["train_s"] + (t.get("export_s") or 0.0), 1)


def write_report(out: Path, results: dict[str, Any]) -> None:
    """Write out/results.json and out/report.md."""
    results["freshness"] = freshness(results)
    results["goals"] = g = goals(results)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    s = results["interval_s"]
    lines = [
        "# Online learning demo",
        "",
        f"World days {results['start_day']:g} to {results['end_day']:g} at drift scale {results['drift_scale']:g}; "
        f"{results['rate_requests_per_s']:g} requests/s of {results['instances_per_request']} rows; intervals of "
        f"{s:g} s, attribution window {results['window_s']:g} s; model repository `{results['repo']}`; "
        f"published versions {results['published_versions']}; {results['wall_s']:.0f} s in all.",
        "",
        "## AUC on the next interval's traffic",
        "",
        "| interval | outcome | online version | rows of next interval | static v1 | online | oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["intervals"]:
        lines.append(
            f"| {r['interval']} | {r['outcome']} | {r['online_version']} | {r['next_interval_rows']} | "
            f"{r['static_auc']:.4f} | {r['online_auc']:.4f} | {r['oracle_auc']} |"
        )
    lines += [
        "",
        "## Intervals",
        "",
        "| interval | outcome | rows | join+train+export s | train s | export s |",
        "|---|---|---|---|---|---|",
    ]
    for o in results["outcomes"]:
        lines.append(
            f"| {o['interval']} | {o['outcome']} | {o.get('rows')} | {o['seconds']} | {o.get('train_s', '')} | "
            f"{o.get('export_s', '')} |"
        )
    lines += ["", "## Freshness: first possible click to the server serving the version", ""]
    lines += [
        f"- interval {f['interval']} -> version {f['version']}: {f['click_to_served_s']} s "
        f"({f['intervals']} intervals)"
        for f in results["freshness"]
    ]
    t = results.get("ten_x") or {}
    if t:
        lines += [
            "",
            f"## 10x the rate: {t['rows']} training rows (an interval and its replay), {t['samples_per_s']} "
            f"samples/s: training {t['train_s']} s + export {t['export_s']} s (independent of the rows)",
        ]
    lines += ["", "## Goals", "", *[f"- {k}: {v}" for k, v in g.items()], ""]
    (out / "report.md").write_text("\n".join(lines))
