"""The framework comparison: JAX, MLX, TorchServe and DDP rows in the report and plots (on a synthetic results
dict), and smoke tests of the JAX, MLX and TorchServe workers in their own venvs (skipped, with the reason,
where a venv is absent: `make bench BENCH=quick` creates them)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.container import BarContainer

from bench.harness import procs
from bench.harness.foreign_venvs import JAX, MLX, TORCHSERVE, ForeignVenv, unavailable_reason
from bench.harness.inputs import child_env
from bench.harness.servers import Server, free_port
from bench.peers import torchserve_server
from bench.report.markdown import render_report
from bench.report.measurements import flatten
from bench.report.plots import draw_figures, write_plots
from ctr_model.net import CTRNet, CTRProbability, ModelConfig
from tests.bench.bench_results import make_results
from tests.bench.mdtables import read_sections, read_tables
from tests.helpers import REPO_ROOT

PLOTS = {"training_throughput.png", "inference_latency.png", "latency_vs_load.png"}
MLX_ERROR = "could not build .venv-mlx: exit code 1: pip install mlx[cpu]\nERROR: No matching distribution found for mlx-cpu"


def with_new_rows(results: dict[str, Any]) -> dict[str, Any]:
    """The synthetic run plus what this issue adds: JAX and MLX training, JAX jit inference, TorchServe, DDP."""
    training = results["sections"]["training"]
    training["rows"] += [
        {
            "name": "JAX + Flax (jax.jit)",
            "samples_per_sec": 60_000.0,
            "samples_per_sec_runs": [60_000.0],
            "val_auc": 0.7512,
            "ratio_vs_bare": 1.5,
            "versions": {"jax": "0.10.2", "flax": "0.12.8", "optax": "0.2.8"},
        },
        {"name": "MLX (mlx.nn, CPU)", "error": MLX_ERROR, "versions": {}},
    ]
    # bench.sections.scaling's DDP point (its section owns the measurement; the framework table reuses it)
    ddp = {
        "rows": 12_000,
        "samples_per_sec_1": 40_000.0,
        "samples_per_sec_2": 60_000.0,
        "speedup": 1.5,
        "backend": "gloo",
        "usable_cores": 2,
    }
    results["sections"]["scaling"] = {"status": "ok", "seconds": 30.0, "rows": [], "ddp": ddp}
    for batch in (1, 64, 1024):
        results["sections"]["inference"]["rows"].append(
            {
                "backend": "JAX jit",
                "batch": batch,
                "p50_ms": 0.1 * batch,
                "p99_ms": 0.2 * batch,
                "p50_ms_runs": [0.1 * batch] * 2,
                "p99_ms_runs": [0.2 * batch] * 2,
                "runs": 2,
                "calls": 50,
                "versions": {"jax": "0.10.2", "flax": "0.12.8"},
            }
        )
    serving = results["sections"]["serving"]
    serving["rows"] += [
        {
            "server": "torchserve (TorchScript)",
            "connections": c,
            "qps": 300.0 * min(c, 8),
            "p50_ms": 2.0 * c,
            "p90_ms": 3.0 * c,
            "p99_ms": 5.0 * c,
            "errors": 0.0,
        }
        for c in (1, 8, 64)
    ]
    serving["rss_mib"] = {"ours (batching off)": 150.0, "torchserve (TorchScript)": 912.5}
    serving["request_apis"] = {
        "ours (batching off)": "POST /v1/models/ctr:predict",
        "torchserve (TorchScript)": torchserve_server.REQUEST_API,
    }
    serving["versions"] = {"torchserve (TorchScript)": {"torchserve": "0.12.0", "torch": "2.13.0+cpu"}}
    return results


def test_report_opens_with_the_framework_table_of_this_runs_figures() -> None:
    sections = read_sections(render_report(with_new_rows(make_results()), PLOTS))

    assert next(iter(sections)) == "Frameworks"
    [rows] = read_tables(sections["Frameworks"])
    by_name = {r["framework"]: r for r in rows}
    assert list(by_name) == [
        "PyTorch (bare loop, eager, FastAPI)",
        "PyTorch + Lightning → ONNX Runtime (ours)",
        "TF / Keras",
        "JAX + Flax",
        "MLX (CPU)",
        "TorchServe (TorchScript)",
        "KServe (ONNX Runtime)",
    ]
    assert by_name["JAX + Flax"] == {
        "framework": "JAX + Flax",
        "versions": "jax 0.10.2, flax 0.12.8, optax 0.2.8",
        "train samples/s": "60,000",
        "val AUC": "0.7512",
        "inference p99 ms (batch 1)": "0.2",
        "serving QPS (64 connections)": "n/a",
    }
    assert by_name["PyTorch + Lightning → ONNX Runtime (ours)"] == {
        "framework": "PyTorch + Lightning → ONNX Runtime (ours)",
        "versions": "torch 2.13.0, lightning 2.5.0, onnxruntime 1.23.0",
        "train samples/s": "36,000",
        "val AUC": "0.75",
        "inference p99 ms (batch 1)": "0.1",
        "serving QPS (64 connections)": "24,000",
    }
    torchserve = by_name["TorchServe (TorchScript)"]
    assert torchserve["versions"] == "torchserve 0.12.0, torch 2.13.0+cpu"
    assert (torchserve["train samples/s"], torchserve["serving QPS (64 connections)"]) == ("n/a", "2,400")
    assert by_name["MLX (CPU)"]["train samples/s"] == "error"
    assert by_name["KServe (ONNX Runtime)"]["serving QPS (64 connections)"] == "8,000"
    assert (
        "- MLX (CPU), training: could not build .venv-mlx: exit code 1: pip install mlx[cpu]"
        in sections["Frameworks"]
    )
    assert (
        "DDP (gloo, measured in the scaling section): 1 process 40,000 samples/s, 2 processes 60,000 samples/s, "
        "efficiency 0.75 (2-process ÷ (2 × 1-process)). On this 2-core machine the two processes share the "
        "cores, so this is the cost of DDP on one box, not the gain of a second one."
    ) in sections["Frameworks"]


def test_a_server_that_did_not_start_is_explained_under_the_table() -> None:
    results = with_new_rows(make_results())
    serving = results["sections"]["serving"]
    serving["rows"] = [r for r in serving["rows"] if r["server"] != "kserve ModelServer"]
    serving["notes"] = ["kserve skipped: /work/.venv-kserve is absent; the quick and full modes create it"]

    lines = read_sections(render_report(results, PLOTS))["Frameworks"]

    [rows] = read_tables(lines)
    assert rows[-1]["serving QPS (64 connections)"] == "not run"
    assert (
        "- KServe (ONNX Runtime), serving: kserve skipped: /work/.venv-kserve is absent; the quick and full modes create it"
        in lines
    )


def test_sections_left_out_of_the_run_are_dashes_with_one_line_each() -> None:
    results = with_new_rows(make_results())
    del results["sections"]["inference"], results["sections"]["serving"]

    lines = read_sections(render_report(results, PLOTS))["Frameworks"]

    [rows] = read_tables(lines)
    assert [(r["train samples/s"], r["inference p99 ms (batch 1)"], r["serving QPS"]) for r in rows[:2]] == [
        ("40,000", "–", "–"),
        ("36,000", "–", "–"),
    ]
    assert [line for line in lines if line.startswith("- ")] == [
        "- inference: not measured in this run (`--sections` left it out)",
        "- serving: not measured in this run (`--sections` left it out)",
        "- MLX (CPU), training: could not build .venv-mlx: exit code 1: pip install mlx[cpu]",
    ]


def test_a_framework_that_cannot_run_shows_the_exact_error_in_its_section() -> None:
    sections = read_sections(render_report(with_new_rows(make_results()), PLOTS))

    training = sections["1. Training throughput"]
    [rows] = read_tables(training)
    assert rows[-2]["× bare PyTorch loop"] == "1.50×"
    assert rows[-1] == {
        "pipeline": "MLX (mlx.nn, CPU) (error below)",
        "samples/s (median)": "–",
        "spread (min–max)": "–",
        "runs": "–",
        "val AUC": "–",
        "× bare PyTorch loop": "–",
    }
    assert "ERROR: No matching distribution found for mlx-cpu" in training


def test_compare_sees_the_new_rows_and_the_ddp_figures() -> None:
    figures = flatten(with_new_rows(make_results()))

    assert figures["training/JAX + Flax (jax.jit)/samples_per_sec"] == 60_000.0
    assert figures["inference/JAX jit/batch=64/p99_ms"] == 12.8
    assert figures["serving/torchserve (TorchScript)/c=64/qps"] == 2_400.0
    assert {k: v for k, v in figures.items() if k.startswith("scaling/ddp/")} == {
        "scaling/ddp/samples_per_sec_1": 40_000.0,
        "scaling/ddp/samples_per_sec_2": 60_000.0,
        "scaling/ddp/efficiency": 0.75,
    }
    assert not any(k.startswith("training/MLX") for k in figures)  # the row that could not run has no figure


def test_serving_section_gives_each_servers_rss_and_request_api() -> None:
    sections = read_sections(render_report(with_new_rows(make_results()), PLOTS))

    [_, memory] = read_tables(sections["3. End-to-end serving"])
    assert memory == [
        {
            "server": "ours (batching off)",
            "RSS MiB after the load": "150",
            "request API": "POST /v1/models/ctr:predict",
        },
        {
            "server": "torchserve (TorchScript)",
            "RSS MiB after the load": "912",
            "request API": "TorchServe predictions API (POST /predictions/ctr), TF-Serving-style body via a custom handler",
        },
    ]


def bar_lengths(ax: Axes, horizontal: bool = False) -> dict[str, list[float]]:
    """Each bar series of `ax` by its label: widths (horizontal bars) or heights, in drawing order."""
    return {
        str(c.get_label()): [float(b.get_width() if horizontal else b.get_height()) for b in c]
        for c in ax.containers
        if isinstance(c, BarContainer)
    }


def tick_labels(ticks: list[Any]) -> list[str]:
    return [t.get_text() for t in ticks]


def test_plots_draw_the_new_rows_and_skip_a_row_that_could_not_run(tmp_path: Path) -> None:
    results = with_new_rows(make_results())
    figures = draw_figures(results)
    try:
        for fig in figures.values():
            fig.canvas.draw()  # categorical tick labels exist once drawn
        assert set(figures) == PLOTS  # the scaling section has no rows: no plot

        [training] = figures["training_throughput.png"].axes
        names = [
            "bare PyTorch loop",
            "our Lightning pipeline",
            "naive Lightning DataLoader",
            "Keras model.fit",
        ]
        assert tick_labels(training.get_yticklabels()) == [
            *names,
            "JAX + Flax (jax.jit)",
        ]  # MLX failed: no bar
        [widths] = bar_lengths(training, horizontal=True).values()
        assert widths == [40_000.0, 36_000.0, 4_000.0, 52_000.0, 60_000.0]
        assert [t.get_text() for t in training.texts][-1] == "  60,000  (AUC 0.7512)"

        panels = figures["inference_latency.png"].axes
        assert [ax.get_title() for ax in panels] == ["batch 1", "batch 64", "batch 1024"]
        backends = ["PyTorch eager", "TorchScript", "ONNX Runtime", "TF SavedModel", "JAX jit"]
        for ax, batch in zip(panels, (1, 64, 1024), strict=True):
            assert tick_labels(ax.get_xticklabels()) == backends
            series = bar_lengths(ax)
            assert list(series) == ["p50", "p99"]
            assert (series["p50"][-1], series["p99"][-1]) == pytest.approx((0.1 * batch, 0.2 * batch))

        latency, throughput = figures["latency_vs_load.png"].axes
        servers = [
            "ours (batching off)",
            "ours (batching on)",
            "kserve ModelServer",
            "naive fastapi+pytorch",
            "torchserve (TorchScript)",
        ]
        assert latency.get_legend_handles_labels()[1] == [f"{s} p99" for s in servers]
        qps = {line.get_label(): list(line.get_ydata()) for line in throughput.get_lines()}
        assert list(qps) == servers
        assert qps["torchserve (TorchScript)"] == [300.0, 2_400.0, 2_400.0]
        p99 = {line.get_label(): list(line.get_ydata()) for line in latency.get_lines()}
        assert p99["torchserve (TorchScript) p99"] == [5.0, 40.0, 320.0]
    finally:
        for fig in figures.values():
            plt.close(fig)

    assert write_plots(results, tmp_path) == PLOTS
    for name in PLOTS:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_venv_reason_names_the_recorded_setup_error_or_how_to_create_it(tmp_path: Path) -> None:
    absent = ForeignVenv("demo", tmp_path / ".venv-demo", ("demo",), "import demo", ("demo",))

    assert unavailable_reason(absent, tmp_path) == (
        ".venv-demo is absent; `make bench BENCH=quick` (or full) creates it (the tiny mode never installs)"
    )
    (tmp_path / "foreign_setup.json").write_text(
        json.dumps({"demo": "could not build .venv-demo: exit code 1"})
    )
    assert unavailable_reason(absent, tmp_path) == "could not build .venv-demo: exit code 1"


# Smoke tests: the real workers in their real venvs, on tiny inputs.


def require(venv: ForeignVenv) -> None:
    """Skip, saying why, unless the venv works (checked in the test, not at collection: imports take seconds)."""
    reason = unavailable_reason(venv, Path("/nonexistent"))
    if reason is not None:
        pytest.skip(f"{venv.name} smoke test skipped: {reason}")


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,200 learnable rows: the label follows the sign of the first feature (plus noise)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1200, 128)).astype(np.float32)
    y = ((x[:, 0] + 0.3 * rng.standard_normal(1200)) > 0).astype(np.float32)
    path = tmp_path_factory.mktemp("features") / "features.npz"
    np.savez(path, train_x=x[:1000], train_y=y[:1000], val_x=x[1000:], val_y=y[1000:])
    return path


def run_worker(venv: ForeignVenv, module: str, features: Path, out: Path) -> dict[str, Any]:
    cmd = [
        str(venv.python),
        "-m",
        module,
        "--features",
        str(features),
        "--epochs",
        "3",
        "--repeats",
        "1",
        "--batch-size",
        "100",
        "--lr",
        "0.01",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT, env=child_env(), timeout=240, capture_output=True)
    return json.loads(out.read_text())


def test_jax_worker_trains_the_mlp_and_learns(features: Path, tmp_path: Path) -> None:
    require(JAX)
    result = run_worker(JAX, "bench.peers.jax_train", features, tmp_path / "jax.json")

    assert result["val_auc"] > 0.85  # chance is 0.5; the noise caps it near 0.95
    assert result["samples_per_sec"] == result["samples_per_sec_runs"][0] > 0
    assert sorted(result["versions"]) == ["flax", "jax", "optax"]


def test_mlx_worker_trains_the_mlp_and_learns(features: Path, tmp_path: Path) -> None:
    require(MLX)
    result = run_worker(MLX, "bench.peers.mlx_train", features, tmp_path / "mlx.json")

    assert result["val_auc"] > 0.85  # chance is 0.5; the noise caps it near 0.95
    assert result["samples_per_sec"] == result["samples_per_sec_runs"][0] > 0
    assert list(result["versions"]) == ["mlx"]


def write_checkpoint(path: Path) -> CTRNet:
    """A Lightning-shaped checkpoint of a random CTRNet (what `ctr_model.checkpoint.load_net` reads)."""
    torch.manual_seed(0)
    net = CTRNet(ModelConfig(activation="hardtanh")).eval()
    state = {f"net.{k}": v for k, v in net.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": {"model": net.cfg.to_dict()}}, path)
    return net


def test_jax_forward_reproduces_the_checkpoint_and_times_each_batch(tmp_path: Path) -> None:
    require(JAX)
    from bench.peers import jax_forward

    write_checkpoint(tmp_path / "best.ckpt")
    plan = {"warmup_calls": 2, "repeats": 2, "calls": {"1": 5, "64": 3}}

    rows, command = jax_forward.measure(tmp_path / "best.ckpt", plan, 1, tmp_path, JAX.python)

    assert [(r["backend"], r["batch"], r["calls"], r["runs"]) for r in rows] == [
        ("JAX jit", 1, 5, 2),
        ("JAX jit", 64, 3, 2),
    ]
    assert all(r["max_abs_diff_vs_torch"] <= 1e-4 and 0 < r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert command.startswith(f"{JAX.python} -m bench.peers.jax_forward --weights ")


# export traces model.pt with torch.jit.trace too; its deprecation warning is not this test's subject
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
def test_torchserve_serves_model_pt_with_the_tf_serving_body(tmp_path: Path) -> None:
    require(TORCHSERVE)
    net = write_checkpoint(tmp_path / "best.ckpt")
    version = tmp_path / "models" / "ctr" / "1"
    version.mkdir(parents=True)
    example = torch.rand(2, 128)
    torch.jit.trace(CTRProbability(net), example).save(str(version / "model.pt"))
    ts = torchserve_server.launch(version, tmp_path, free_port)
    server = Server("torchserve", ts.cmd, ts.port, path=ts.path, cwd=ts.cwd, env=ts.env)
    try:
        server.start(tmp_path, [])
        body = json.dumps({"instances": example.tolist()}).encode()
        request = urllib.request.Request(server.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            predictions = json.loads(response.read())["predictions"]
        assert server.proc is not None
        rss = procs.group_rss_mib(server.proc.pid)
    finally:
        procs.stop_all()

    with torch.no_grad():
        expected = CTRProbability(net)(example).numpy()
    np.testing.assert_allclose(np.array(predictions), expected, atol=1e-6)
    assert np.array(predictions).shape == (2, 1)
    assert rss > 100  # the JVM and the Python worker together
    assert server.url.endswith("/predictions/ctr")


@pytest.mark.slow  # a first build downloads and installs each framework: minutes
@pytest.mark.timeout(2000)
@pytest.mark.parametrize("venv", [JAX, MLX, TORCHSERVE], ids=lambda v: v.name)
def test_foreign_venv_builds_on_first_use_or_says_why_not(venv: ForeignVenv, tmp_path: Path) -> None:
    try:
        python = venv.ensure(tmp_path / "install.log")
    except procs.StepError as e:
        pytest.skip(f"{venv.path.name} cannot be built here (offline?): {str(e).splitlines()[0]}")

    assert python == venv.python
    assert venv.ready()
    assert sorted(venv.versions()) == sorted(venv.distributions)


@pytest.mark.slow  # two real training runs (1 process, then 2 gloo DDP processes)
def test_ddp_scaling_reports_both_rates_and_their_efficiency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import ddp_scaling

    argv = ["--rows", "3000", "--epochs", "1", "--batch-size", "256", "--workdir", str(tmp_path)]
    assert ddp_scaling.main(argv) == 0

    out = capsys.readouterr().out
    r = json.loads(out[: out.rindex("}") + 1])
    one = json.loads((tmp_path / "ddp1" / "metrics.json").read_text())
    two = json.loads((tmp_path / "ddp2" / "metrics.json").read_text())
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert (r["samples_per_sec_1"], r["samples_per_sec_2"]) == (
        one["samples_per_sec"],
        two["samples_per_sec"],
    )
    assert r["backend"] == "gloo"
    assert r["efficiency"] == r["samples_per_sec_2"] / (2 * r["samples_per_sec_1"])
    assert out.splitlines()[-1] == (
        f"DDP (gloo): 1 process {r['samples_per_sec_1']:,.0f} samples/s, 2 processes "
        f"{r['samples_per_sec_2']:,.0f} samples/s, efficiency {r['efficiency']:.2f}"
    )


def test_scaling_reports_the_loaders_ratio_as_the_median_of_its_pairs_and_compare_tracks_it() -> None:
    results = with_new_rows(make_results())
    results["sections"]["scaling"]["loaders"] = {
        "rows": 90_000,
        "pairs": [[300_000.0, 320_000.0], [290_000.0, 300_000.0], [250_000.0, 330_000.0]],
        "stream_over_memory": 0.9375,
        "spread": [0.7576, 0.9667],
        "ab_stream_over_memory": 0.93,
        "ab_rounds": 30,
        "ab_command": "python -m bench.sections.scaling --ab train.txt --ab-rows 90000 --ab-rounds 30",
    }
    report = render_report(results, PLOTS)

    assert (
        "Streamed ÷ in-memory on 90,000 rows: **0.938**, the median of 3 alternating pairs of whole runs "
        "(spread 0.758–0.967; stream / memory samples/s: 300,000 / 320,000, 290,000 / 300,000, 250,000 / 330,000); "
        "in one process, alternating rounds of the pipeline's step: 0.93." in report
    )
    figures = flatten(results)
    assert figures["scaling/loaders/stream_over_memory"] == 0.9375
    assert figures["scaling/loaders/ab_stream_over_memory"] == 0.93
