"""The fast defaults: an old checkpoint still loads and exports, and the same data gives the same val AUC."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from ctr_contract.signatures import OUTPUT_NAMES
from ctr_model.checkpoint import load_net, read_checkpoint
from ctr_model.dropout import MaskedDropout
from export.onnx.onnx_export import export_onnx
from training.model.lightning_module import CTRModule
from training.runtime.malloc import policy
from training.runtime.speed import SpeedSettings
from training.synth import generate

# Written by the code before issue 17 (torch nn.Dropout, no fast_dropout hyperparameter): width 8, hidden 8/4.
OLD_CHECKPOINT = Path(__file__).parents[2] / "ctr_model" / "checkpoint_before_issue17.ckpt"


def test_checkpoint_from_before_the_fast_defaults_loads_and_exports_with_parity(tmp_path: Path) -> None:
    assert "fast_dropout" not in read_checkpoint(OLD_CHECKPOINT)["hyper_parameters"]
    net, _ = load_net(OLD_CHECKPOINT)
    assert not any(isinstance(m, MaskedDropout) for m in net.modules())  # export sees plain nn.Dropout
    proto = export_onnx(net, 8, tmp_path / "model.onnx", opset=17)  # no calibrator: ctr = raw_score
    # Identity: the graph's second output (raw_score) is the same sigmoid as its first
    assert sorted({n.op_type for n in proto.graph.node}) == ["Gemm", "Identity", "Relu", "Sigmoid"]
    assert tuple(o.name for o in proto.graph.output) == OUTPUT_NAMES
    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    outputs = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"features": x})
    with torch.no_grad():
        want = net.predict_proba(torch.from_numpy(x)).numpy()
    for got in outputs:
        assert float(np.abs(got - want).max()) <= 1e-6


def test_old_checkpoint_resumes_into_a_fast_dropout_module_with_the_same_weights() -> None:
    module = CTRModule.load_from_checkpoint(OLD_CHECKPOINT, fast_dropout=True)
    assert [type(m).__name__ for m in module.net.layers] == [
        "Linear",
        "ReLU",
        "MaskedDropout",
        "Linear",
        "ReLU",
        "MaskedDropout",
        "Linear",
    ]
    old = read_checkpoint(OLD_CHECKPOINT)["state_dict"]
    assert all(torch.equal(v, old[f"net.{k}"]) for k, v in module.net.state_dict().items())


def test_speed_settings_on_gpu_keep_torch_dropout_and_use_fused_adam() -> None:
    speed = SpeedSettings.choose("gpu")
    assert (speed.fast_dropout, speed.adam_impl) == (False, "fused")
    assert speed.reasons[0] == "dropout torch (GPU: torch's fused dropout is already fast)"


def test_speed_settings_flags_turn_each_cpu_speedup_off() -> None:
    speed = SpeedSettings.choose("cpu", fast_dropout=False, adam_impl="default", precision="32-true")
    assert (speed.fast_dropout, speed.adam_impl, speed.precision) == (False, "default", "32-true")
    assert speed.line().startswith(
        "speed: dropout torch (--no-fast-dropout); adam default (--adam-impl default); "
        "precision 32-true (--precision 32-true); threads "
    )


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_fast_defaults_reach_the_val_auc_of_torch_defaults_on_the_same_data(
    tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    # 20k rows (~2k val rows): on the 4000-row fixture two dropout draws alone move the AUC by more than 0.003.
    data = tmp_path / "train.txt"
    generate(data, rows=20_000, seed=3)
    aucs = {}
    for name, flags in {
        "fast": (),
        "off": (
            "--no-fast-dropout",
            "--adam-impl",
            "default",
            "--precision",
            "32-true",
            "--no-malloc-tuning",
        ),
    }.items():
        out = tmp_path / name
        proc = run_module(
            "training",
            "--data",
            data,
            "--out",
            out,
            "--batch-size",
            "512",
            "--max-epochs",
            "3",
            "--patience",
            "5",
            "--no-progress-bar",
            *flags,
            check=True,
        )
        metrics = json.loads((out / "metrics.json").read_text())
        aucs[name] = metrics["val_auc"]
        assert ("speed: dropout fast" in proc.stdout) == (name == "fast")
        malloc = (
            "malloc mmap above 1 MiB (--no-malloc-tuning: freed blocks of 1 MiB and more go back to the OS)"
            if name == "off"
            else f"malloc {policy(512 * 256 * 4)}"
        )
        assert malloc in proc.stdout
        want = "32-true" if name == "off" else SpeedSettings.choose("cpu").precision
        assert metrics["speed"]["precision"] == want
    assert aucs["fast"] == pytest.approx(aucs["off"], abs=0.003)
