"""PNG plots of a bench run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless machines and CI have no display
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from bench.report.measurements import ok_rows, spread


def training_figure(rows: list[dict[str, Any]]) -> Figure:
    """Horizontal bars: median samples/s per pipeline, whiskers at the min and max run (rows that ran)."""
    rows = [r for r in rows if isinstance(r.get("samples_per_sec"), int | float)]
    names = [r["name"] for r in rows]
    medians = [float(r["samples_per_sec"]) for r in rows]
    lo, hi = [], []
    for r, m in zip(rows, medians, strict=True):
        s = spread(r.get("samples_per_sec_runs")) or (m, m)
        lo.append(m - s[0])
        hi.append(s[1] - m)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(rows)))
    ax.barh(names, medians, xerr=[lo, hi], capsize=4, color="tab:blue")
    for y, r in enumerate(rows):
        auc = r.get("val_auc")
        label = f"{medians[y]:,.0f}" + (f"  (AUC {auc:.4f})" if isinstance(auc, int | float) else "")
        ax.text(medians[y] + hi[y], y, "  " + label, va="center", fontsize=8)  # right of the whisker
    ax.invert_yaxis()
    ax.set_xlabel("training samples/s (median of runs; whiskers: min–max)")
    ax.set_title("Training throughput")
    ax.margins(x=0.35)
    fig.tight_layout()
    return fig


def inference_figure(rows: list[dict[str, Any]]) -> Figure:
    """One panel per batch size: p50 and p99 bars per backend."""
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        sub = [r for r in rows if r["batch"] == batch]
        xs = range(len(sub))
        ax.bar([x - 0.2 for x in xs], [r["p50_ms"] for r in sub], width=0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [r["p99_ms"] for r in sub], width=0.4, label="p99")
        ax.set_xticks(list(xs), [r["backend"] for r in sub], rotation=30, ha="right", fontsize=8)
        ax.set_title(f"batch {batch}")
        ax.set_ylabel("latency ms")
        ax.legend(fontsize=8)
    fig.suptitle("In-process inference latency per backend")
    fig.tight_layout()
    return fig


def serving_figure(rows: list[dict[str, Any]]) -> Figure:
    """Latency vs load: p99 (solid) and p50 (dashed) per server against connections, and QPS beside it."""
    fig, (ax_lat, ax_qps) = plt.subplots(1, 2, figsize=(12, 4.5))
    for server in dict.fromkeys(r["server"] for r in rows):
        sub = sorted((r for r in rows if r["server"] == server), key=lambda r: r["connections"])
        conns = [r["connections"] for r in sub]
        (line,) = ax_lat.plot(conns, [r["p99_ms"] for r in sub], marker="o", label=f"{server} p99")
        ax_lat.plot(conns, [r["p50_ms"] for r in sub], marker=".", linestyle="--", color=line.get_color())
        ax_qps.plot(conns, [r["qps"] for r in sub], marker="o", label=server, color=line.get_color())
    ticks = sorted({r["connections"] for r in rows})
    for ax in (ax_lat, ax_qps):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("concurrent connections")
        ax.legend(fontsize=7)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency ms (p99 solid, p50 dashed)")
    ax_lat.set_title("Latency vs load")
    ax_qps.set_ylabel("requests/s")
    ax_qps.set_title("Throughput vs load")
    fig.tight_layout()
    return fig


def scaling_figure(rows: list[dict[str, Any]]) -> Figure:
    """Peak RSS per process and samples/s against the row count, one line per loader (1 process)."""
    fig, (ax_rss, ax_sps) = plt.subplots(1, 2, figsize=(11, 4))
    for loader in dict.fromkeys(r["loader"] for r in rows):
        sub = sorted(
            (r for r in rows if r["loader"] == loader and r["processes"] == 1), key=lambda r: r["rows"]
        )
        xs = [r["rows"] for r in sub]
        ax_rss.plot(xs, [r["peak_rss_mib"] for r in sub], marker="o", label=loader)
        ax_sps.plot(xs, [r["samples_per_sec"] for r in sub], marker="o", label=loader)
    for ax, label in ((ax_rss, "peak RSS MiB per process"), (ax_sps, "training samples/s")):
        ax.set_xscale("log")
        ax.set_xlabel("rows")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    ax_rss.set_title("Memory vs data size")
    ax_sps.set_title("Throughput vs data size")
    fig.tight_layout()
    return fig


FIGURES: dict[str, tuple[str, Callable[[list[dict[str, Any]]], Figure]]] = {
    "training": ("training_throughput.png", training_figure),
    "inference": ("inference_latency.png", inference_figure),
    "serving": ("latency_vs_load.png", serving_figure),
    "scaling": ("data_scaling.png", scaling_figure),
}


def draw_figures(results: dict[str, Any]) -> dict[str, Figure]:
    """One figure per measured section, keyed by its PNG file name; a failed or empty section gets none."""
    figures: dict[str, Figure] = {}
    for section, (filename, draw) in FIGURES.items():
        rows = ok_rows(results, section)
        if not rows:
            continue
        try:
            figures[filename] = draw(rows)
        except (KeyError, TypeError, ValueError) as e:
            # A plot is never worth losing the run's report and results.json over; say why it is missing.
            print(f"[bench] warning: no {filename}: rows of section {section!r} cannot be plotted: {e!r}")
    return figures


def write_plots(results: dict[str, Any], out_dir: Path) -> set[str]:
    """Write one PNG per measured section into `out_dir`.

    Returns:
        The file names written; a section that failed or has no rows gets no plot.
    """
    figures = draw_figures(results)
    try:
        for filename, fig in figures.items():
            fig.savefig(out_dir / filename, dpi=110)
    finally:
        for fig in figures.values():
            plt.close(fig)
    return set(figures)
