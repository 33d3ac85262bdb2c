"""The rollout demo's record and report: what the config file said when, and results.json, report.md, rollout.png.

Everything is read back from the files the processes wrote: the request logs (who answered each request), the
simulator's summary (client errors), the live evaluator's history.jsonl and joined partitions, and the
controller's decisions.jsonl. The model config file has no history of its own, so `Timeline` polls it while
the demo runs.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.traffic import mix32
from ctr_model.metrics import roc_auc
from pipelines.clicks.events import parse_time

LABEL_RE = re.compile(r'version_labels\s*\{\s*key:\s*"(\w+)"\s*value:\s*(\d+)\s*\}')
VERSIONS_RE = re.compile(r"versions:\s*(\d+)")
DIRECTIVE_RE = re.compile(r"^\s*#\s*ctr-traffic:(.*)$", re.M)
BAD, GOOD = 3, 2


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a file (none when it is missing; a line cut short is skipped)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def parse_config(text: str, model: str = "ctr") -> dict[str, Any]:
    """The labels, listed versions and traffic shares of a (one-model) config file."""
    shares = {"canary_percent": 0.0, "shadow_percent": 0.0}
    for m in DIRECTIVE_RE.finditer(text):
        keys = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
        if keys.get("model") == model:
            shares |= {k: float(v) for k, v in keys.items() if k in shares}
    labels = {k: int(v) for k, v in LABEL_RE.findall(text)}
    return {"labels": labels, "versions": sorted({int(v) for v in VERSIONS_RE.findall(text)}), **shares}


class Timeline:
    """The model config file and the controller's decisions, polled while the demo runs."""

    def __init__(self, config: Path, rollout_state: Path) -> None:
        self.config, self.rollout_state = config, rollout_state
        self.url: str | None = None
        self.changes: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self._text: str | None = None

    def poll(self) -> None:
        try:
            text = self.config.read_text()
        except OSError:
            text = None
        if text and text != self._text:
            self._text = text
            self.changes.append({"time": time.time(), **parse_config(text)})
        self.decisions = read_jsonl(self.rollout_state / "decisions.jsonl")

    @property
    def stable(self) -> int | None:
        return self.changes[-1]["labels"].get("stable") if self.changes else None

    def rejected(self) -> set[int]:
        return {int(d["version"]) for d in self.decisions if d.get("action") == "rollback"}

    def decision(self, version: int, action: str) -> dict[str, Any] | None:
        return next(
            (d for d in self.decisions if d.get("version") == version and d.get("action") == action), None
        )

    def up(self) -> bool:
        """Whether the server answers its model status with a version AVAILABLE."""
        try:
            with urllib.request.urlopen(self.url or "", timeout=2) as r:
                status = json.load(r)["model_version_status"]
        except (OSError, ValueError, KeyError):
            return False
        return any(v.get("state") == "AVAILABLE" for v in status)


def request_lines(logs: Path) -> list[dict[str, Any]]:
    """Each logged answer: time, request id, version, label, canary, shadow, fallback (inputs dropped)."""
    out = []
    for path in sorted(logs.rglob("requests-*.jsonl")):
        for line in read_jsonl(path):
            model = line.get("model") or {}
            out.append(
                {
                    "time": parse_time(line["time"])
                    if isinstance(line.get("time"), str)
                    else line.get("time"),
                    "request_id": line.get("request_id"),
                    "version": model.get("version"),
                    "label": model.get("label"),
                    "canary": bool(line.get("canary")),
                    "shadow": bool(line.get("shadow")),
                    "fallback": line.get("fallback"),
                }
            )
    return sorted(out, key=lambda r: r["time"])


def in_canary_bucket(request_id: str, percent: float) -> bool:
    """The server's split (ctr_contract/traffic.py): mix32(crc32(b"canary:" + id)) < p/100 * 2**32."""
    return mix32(zlib.crc32(b"canary:" + request_id.encode())) < percent / 100 * 2**32


def bad_exposure(lines: list[dict[str, Any]], timeline: Timeline, a: dict[str, Any]) -> dict[str, Any]:
    """How long the bad version answered clients, and what share of their requests."""
    primary = [r for r in lines if not r["shadow"]]
    bad = [r for r in primary if r["version"] == BAD]
    rollback = timeline.decision(BAD, "rollback")
    out: dict[str, Any] = {
        "answered": len(bad),
        "shadow_scored": sum(r["shadow"] and r["version"] == BAD for r in lines),
    }
    if not bad:
        return out | {"windows_to_rollback": 0 if rollback else None, "share": 0.0}
    first, last = bad[0]["time"], bad[-1]["time"]
    during = [r for r in primary if first <= r["time"] <= last]
    out |= {
        "first_answer": first,
        "last_answer": last,
        "share": round(len(bad) / len(during), 4),
        "requests_meanwhile": len(during),
        # the split's own share of those requests: the ids whose hash falls in the canary bucket
        "canary_bucket_share": round(
            sum(in_canary_bucket(r["request_id"], a["canary_percent"]) for r in during) / len(during), 4
        ),
        "all_in_canary_bucket": all(in_canary_bucket(r["request_id"], a["canary_percent"]) for r in bad),
        "share_of_all_requests": round(len(bad) / len(primary), 4),
    }
    if rollback:
        out["rollback_time"] = rollback["time"]
        out["windows_to_rollback"] = round((rollback["time"] - first) / a["interval_s"], 2)
        out["seconds_to_rollback"] = round(rollback["time"] - first, 1)
        out["answers_after_rollback_s"] = round(max(0.0, last - rollback["time"]), 2)
    return out


def _joined(eval_state: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted((eval_state / "joined").glob("*/interval-*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    return pa.concat_tables(tables, promote_options="default") if tables else None


def live_vs_offline(out: Path, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (version, label): the live AUC of its fullest window, and the version's AUC scored offline on the same rows."""
    from pipelines.demos.online_evaluate import score_version

    table = _joined(out / "eval")
    best: dict[tuple[int, str], tuple[dict[str, Any], dict[str, Any]]] = {}
    for snap in history:
        for f in snap.get("figures", []):
            key = (int(f["version"]), str(f["label"]))
            if f.get("auc") is not None and (key not in best or f["rows"] > best[key][1]["rows"]):
                best[key] = (snap, f)
    rows = []
    for (version, label), (snap, f) in sorted(best.items()):
        entry = {"version": version, "label": label, "live_rows": f["rows"], "live_auc": round(f["auc"], 4)}
        if table is not None:
            t = table.column("time").to_numpy()
            lab = np.array(
                [x if x is not None else "none" for x in table.column("version_label").to_pylist()]
            )
            keep = (table.column("version").to_numpy() == version) & (lab == label)
            keep &= (t >= snap["window_start"]) & (t < snap["window_end"])
            sel = table.filter(keep)
            y = sel.column("label").to_numpy().astype(np.float64)
            if len(sel) and 0 < y.sum() < len(y):
                logged = sel.column("score").to_numpy()
                offline = score_version(out / "repo" / str(version), sel)
                entry |= {
                    "rows": len(sel),
                    "logged_auc": round(roc_auc(y, logged), 4),
                    "offline_auc": round(roc_auc(y, offline), 4),
                    "max_score_diff": float(np.max(np.abs(offline - logged))),
                }
                entry["live_minus_offline"] = round(f["auc"] - roc_auc(y, offline), 4)
        rows.append(entry)
    return rows


LINES = {"stable": "-", "canary": "--", "shadow": ":"}


def _color(version: int) -> str:
    return f"C{(version - 1) % 10}"


def plot(
    out: Path,
    a: dict[str, Any],
    t0: float,
    lines: list[dict[str, Any]],
    history: list[dict[str, Any]],
    timeline: Timeline,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    step = a["interval_s"] / 4  # the share of each quarter of an evaluation interval
    primary = [r for r in lines if not r["shadow"]]
    if primary:
        edges = np.arange(primary[0]["time"] - t0, primary[-1]["time"] - t0 + step, step)
        times = np.array([r["time"] - t0 for r in primary])
        total = np.histogram(times, edges)[0]
        for v in sorted({r["version"] for r in primary}):
            n = np.histogram(times[np.array([r["version"] == v for r in primary])], edges)[0]
            share = 100 * n / np.maximum(total, 1)
            ax1.plot(edges[:-1] + step / 2, share, ".-", color=_color(v), label=f"v{v} answered")
    if timeline.changes:
        end = max([c["time"] for c in timeline.changes] + [r["time"] for r in lines[-1:]])
        xs = [c["time"] - t0 for c in timeline.changes] + [end - t0]
        ys = [c["canary_percent"] for c in timeline.changes]
        ax1.step(xs, [*ys, ys[-1]], where="post", color="k", ls="--", label="canary_percent (config)")
    ax1.set_ylabel("% of requests")
    ax1.set_yscale("symlog", linthresh=10)
    series: dict[tuple[int, str], list[tuple[float, float | None, float | None]]] = {}
    for snap in history:
        for f in snap.get("figures", []):
            key = (int(f["version"]), str(f["label"]))
            series.setdefault(key, []).append(
                (snap["window_end"] - t0, f.get("auc"), f.get("calibration_ratio"))
            )
    for (v, label), pts in sorted(series.items()):
        xs = [p[0] for p in pts]
        style = {"color": _color(v), "ls": LINES.get(label, "-"), "marker": ".", "label": f"v{v} {label}"}
        ax2.plot(xs, [math.nan if p[1] is None else p[1] for p in pts], **style)  # type: ignore[arg-type]
        ax3.plot(xs, [math.nan if p[2] is None else p[2] for p in pts], **style)  # type: ignore[arg-type]
    b = a["calibration_bound"]
    ax3.axhspan(1 - b, 1 + b, color="g", alpha=0.1, label=f"[{1 - b:g}, {1 + b:g}]")
    ax2.set_ylabel("live AUC")
    ax3.set_ylabel("calibration ratio")
    ax3.set_xlabel("seconds since the traffic started")
    for d in timeline.decisions:
        if d.get("action") in ("promote", "rollback", "canary", "shadow"):
            for ax in (ax1, ax2, ax3):
                ax.axvline(d["time"] - t0, color="r" if d["action"] == "rollback" else "grey", lw=0.8, ls=":")
            ax1.annotate(
                f"{d['action']} v{d['version']}", (d["time"] - t0, 1), rotation=90, fontsize=7, va="bottom"
            )
    for ax in (ax1, ax2, ax3):
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "rollout.png", dpi=100)
    plt.close(fig)


def write_report(
    out: Path, a: dict[str, Any], t: dict[str, Any], timeline: Timeline, error: str | None
) -> dict[str, Any]:
    """Write OUT/results.json, OUT/rollout.png and OUT/report.md; returns the results."""
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in a.items()}
    lines = request_lines(out / "logs")
    history = read_jsonl(out / "eval" / "history.jsonl")
    sim = (read_jsonl(out / "simulate.json") or [{}])[0]
    t0 = t.get("traffic") or (lines[0]["time"] if lines else time.time())
    promoted = timeline.decision(GOOD, "promote") is not None
    rolled_back = timeline.decision(BAD, "rollback") is not None and timeline.decision(BAD, "promote") is None
    bad = bad_exposure(lines, timeline, a)
    aucs = live_vs_offline(out, history) if history else []
    gaps = [abs(r["live_minus_offline"]) for r in aucs if "live_minus_offline" in r]
    errors = sim.get("failed")
    results: dict[str, Any] = {
        "promoted": promoted,
        "rolled_back": rolled_back,
        "bad_windows_to_rollback": bad.get("windows_to_rollback"),
        "bad_share": bad.get("share"),
        "canary_percent": a["canary_percent"],
        "client_errors": errors,
        "max_live_minus_offline_auc": round(max(gaps), 4) if gaps else None,
        "error": error,
    }
    w = results["bad_windows_to_rollback"]
    results["goals"] = {
        "good_version_promoted": promoted,
        "bad_version_rolled_back": rolled_back,
        "rolled_back_within_3_windows": rolled_back and w is not None and w <= 3,
        # every request it answered was in the canary bucket: its share is the split's, never more
        "bad_share_at_most_canary_share": bad.get("share") is not None
        and (bad["share"] == 0 or bool(bad.get("all_in_canary_bucket"))),
        "no_client_errors": errors == 0,
        "live_auc_within_0.01_of_offline": bool(gaps) and max(gaps) <= 0.01,
    }
    results |= {"bad_version": bad, "auc_live_vs_offline": aucs, "simulator": sim, "settings": settings}
    results["milestones_s"] = {k: round(v - t0, 1) for k, v in t.items()}
    results["decisions"] = [
        {k: d.get(k) for k in ("seq", "action", "version", "from", "to", "reason")}
        | {"at_s": round(d["time"] - t0, 1)}
        for d in timeline.decisions
    ]
    results["config_changes"] = [c | {"time": round(c["time"] - t0, 1)} for c in timeline.changes]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(out, a, t0, lines, history, timeline)
    (out / "report.md").write_text(_markdown(results))
    return results


def _markdown(r: dict[str, Any]) -> str:
    s, bad = r["settings"], r["bad_version"]
    md = [
        "# Rollout demo",
        "",
        f"{s['rate']:g} requests/s of {s['instances']} rows; live evaluation every {s['interval_s']:g} s over a "
        f"{s['window_s']:g} s window, attribution window {s['attribution_s']:g} s, min rows {s['min_rows']}; policy "
        f"steps {s['steps']}, canary {s['canary_percent']:g}%; version 3's fault: `{s['bad']}` clicks in its calibration.",
        "",
    ]
    if r["error"]:
        md += [f"**The demo stopped early:** {r['error']}", ""]
    md += ["## Goals", "", *[f"- {k}: {v}" for k, v in r["goals"].items()], ""]
    md += [
        f"The bad version answered {bad.get('answered', 0)} requests, a share of {bad.get('share')} of the requests "
        f"while it served ({bad.get('share_of_all_requests')} of all requests); the canary bucket (ids with "
        f"crc32(b'canary:' + id) < {r['canary_percent']:g}% of 2^32) held {bad.get('canary_bucket_share')} of them, "
        f"and every one it answered was in it: {bad.get('all_in_canary_bucket')}. It was rolled back {bad.get('windows_to_rollback')} "
        f"windows ({bad.get('seconds_to_rollback')} s) after its first answer; client errors: {r['client_errors']}.",
        "",
        "![canary share, live AUC and calibration ratio](rollout.png)",
        "",
        "## Decisions",
        "",
        "| s | action | version | from | to | reason |",
        "|---|---|---|---|---|---|",
        *[
            f"| {d['at_s']} | {d['action']} | {d['version']} | {d['from']} | {d['to']} | {d['reason']} |"
            for d in r["decisions"]
        ],
        "",
        "## Live AUC vs the same version scored offline on the same joined rows",
        "",
        "| version | label | live rows | live AUC | rows | logged-score AUC | offline AUC | live - offline |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {x['version']} | {x['label']} | {x['live_rows']} | {x['live_auc']} | {x.get('rows')} | "
            f"{x.get('logged_auc')} | {x.get('offline_auc')} | {x.get('live_minus_offline')} |"
            for x in r["auc_live_vs_offline"]
        ],
        "",
    ]
    return "\n".join(md)
