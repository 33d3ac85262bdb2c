"""report.md on a synthetic results dict: every section, exact figures and ratios, failures with reasons."""

from __future__ import annotations

from typing import Any

from bench.report.markdown import render_report
from tests.bench.bench_results import make_results
from tests.bench.mdtables import read_sections, read_tables

ALL_PLOTS = {"training_throughput.png", "inference_latency.png", "latency_vs_load.png"}


def test_report_holds_machine_inputs_and_every_section(results: dict[str, Any]) -> None:
    sections = read_sections(render_report(results, ALL_PLOTS))

    assert list(sections) == [
        "Frameworks",
        "Summary",
        "Headlines",
        "Machine",
        "Inputs (data → train → export)",
        "1. Training throughput",
        "2. Inference latency (in-process)",
        "3. End-to-end serving",
        "Command",
    ]
    machine_rows = [
        line.split("|")[1:3] for line in sections["Machine"] if line.startswith("| ") and "---" not in line
    ]
    machine = {k.strip(): v.strip() for k, v in machine_rows}
    assert machine["CPU"] == "Test CPU 9000"
    assert machine["cores"] == "2 logical, 2 usable"
    assert machine["torch"] == "2.13.0"
    assert machine["tensorflow"] == "2.21.0"
    assert machine["onnxruntime"] == "1.23.0"
    assert machine["lightning"] == "2.5.0"
    [summary] = read_tables(sections["Summary"])
    assert [(r["section"], r["status"], r["rows"]) for r in summary] == [
        ("Training throughput", "ok", "4"),
        ("Inference latency (in-process)", "ok", "12"),
        ("End-to-end serving", "ok", "12"),
    ]


def test_training_table_has_medians_spread_auc_and_ratio_to_bare_loop(results: dict[str, Any]) -> None:
    sections = read_sections(render_report(results, ALL_PLOTS))
    [rows] = read_tables(sections["1. Training throughput"])

    assert rows[1] == {
        "pipeline": "our Lightning pipeline",
        "samples/s (median)": "36,000",
        "spread (min–max)": "32,400–39,600",
        "runs": "3",
        "val AUC": "0.75",
        "× bare PyTorch loop": "0.90×",
    }
    assert [r["× bare PyTorch loop"] for r in rows] == ["1.00×", "0.90×", "0.10×", "1.30×"]
    assert "![training throughput](training_throughput.png)" in sections["1. Training throughput"]
    assert "python -m training ..." in sections["1. Training throughput"]


def test_training_ratio_is_computed_when_the_module_gives_none(results: dict[str, Any]) -> None:
    for row in results["sections"]["training"]["rows"]:
        del row["ratio_vs_bare"]

    [rows] = read_tables(read_sections(render_report(results, ALL_PLOTS))["1. Training throughput"])

    assert [r["× bare PyTorch loop"] for r in rows] == ["1.00×", "0.90×", "0.10×", "1.30×"]


def test_headlines_compare_each_peer_with_its_baseline(results: dict[str, Any]) -> None:
    headlines = read_sections(render_report(results, ALL_PLOTS))["Headlines"]

    assert headlines[1:4] == [
        "- Training: our Lightning pipeline at 0.90× the bare PyTorch loop (36,000 vs 40,000 samples/s; val AUC 0.75 vs 0.75).",
        "- Training: naive Lightning DataLoader at 0.10× the bare PyTorch loop (4,000 vs 40,000 samples/s; val AUC 0.75 vs 0.75).",
        "- Training: Keras model.fit at 1.30× the bare PyTorch loop (52,000 vs 40,000 samples/s; val AUC 0.75 vs 0.75).",
    ]
    assert (
        "- Inference at batch 64: lowest p99 is ONNX Runtime (0.8 ms, 4.00× faster than PyTorch eager)."
        in headlines
    )
    assert (
        "- Serving at 64 connections: ours (batching on) served 24,000 QPS, 6.00× naive fastapi+pytorch, p99 256 ms vs 256 ms."
        in headlines
    )


def test_inference_table_gives_speed_up_over_pytorch_eager_per_batch(results: dict[str, Any]) -> None:
    sections = read_sections(render_report(results, ALL_PLOTS))
    [rows] = read_tables(sections["2. Inference latency (in-process)"])

    assert len(rows) == 12
    ort_64 = next(r for r in rows if r["backend"] == "ONNX Runtime" and r["batch"] == "64")
    assert ort_64["p50 ms"] == "0.4"
    assert ort_64["p99 ms"] == "0.8"
    assert ort_64["p50 spread"] == "0.2–0.6"
    assert ort_64["p99 spread"] == "0.8–1"
    assert ort_64["runs"] == "3"
    assert ort_64["p99 speed-up vs PyTorch eager"] == "4.00×"
    tf_1 = next(r for r in rows if r["backend"] == "TF SavedModel" and r["batch"] == "1")
    assert tf_1["p50 speed-up vs PyTorch eager"] == "0.50×"


def test_serving_table_gives_qps_and_percentiles_against_naive_server(results: dict[str, Any]) -> None:
    sections = read_sections(render_report(results, ALL_PLOTS))
    [rows] = read_tables(sections["3. End-to-end serving"])

    on_8 = next(r for r in rows if r["server"] == "ours (batching on)" and r["connections"] == "8")
    assert on_8 == {
        "server": "ours (batching on)",
        "connections": "8",
        "QPS": "24,000",
        "p50 ms": "8",
        "p90 ms": "16",
        "p99 ms": "32",
        "QPS × naive fastapi+pytorch": "6.00×",
        "p99 speed-up vs naive fastapi+pytorch": "1.00×",
        "errors": "0",
    }
    serving = sections["3. End-to-end serving"]
    assert (
        "With multi-instance requests, our server with batching on scored 12,000 instances/s (batching off: 8,000)."
        in serving
    )
    assert "- kserve started in 3 s" in serving


def test_failed_section_is_reported_with_its_reason_and_no_table() -> None:
    results = make_results()
    results["sections"]["serving"] = {
        "status": "failed",
        "reason": "timed out after 180 s\nwrk: connection refused",
        "seconds": 180.0,
        "log": "logs/serving.log",
    }
    sections = read_sections(render_report(results, {"training_throughput.png", "inference_latency.png"}))

    serving = sections["3. End-to-end serving"]
    assert serving[:2] == ["", "**FAILED** after 180 s. Reason:"]
    assert "timed out after 180 s" in serving
    assert "wrk: connection refused" in serving
    assert "Log: `logs/serving.log`" in serving
    assert read_tables(serving) == []
    [summary] = read_tables(sections["Summary"])
    assert summary[2] == {"section": "End-to-end serving", "status": "failed", "seconds": "180", "rows": "0"}
