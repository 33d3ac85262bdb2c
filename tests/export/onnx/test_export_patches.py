"""Op patches: Hardtanh becomes exact ReLU arithmetic only for targets without Clip; ReLU is never a stand-in."""

from __future__ import annotations

import torch
from torch import nn

from ctr_model.net import CTRNet, ModelConfig
from export.onnx.patches import PATCHES, HardtanhAsRelu, LeakyReluAsRelu, apply_patches
from export.onnx.targets import PROFILES


def _inputs() -> torch.Tensor:
    # every region: far below min, the kinks, inside, far above max
    return torch.cat([torch.linspace(-50, 50, 20001), torch.tensor([-1.0, 1.0, 0.0, -0.0, 1e30, -1e30])])


def test_hardtanh_patch_matches_hardtanh_everywhere() -> None:
    x = _inputs()
    for lo, hi in ((-1.0, 1.0), (0.0, 6.0), (-0.25, 3.5)):
        got, want = HardtanhAsRelu(lo, hi)(x), nn.Hardtanh(lo, hi)(x)
        assert float((got - want).abs().max()) <= 2 * torch.finfo(torch.float32).eps * max(
            abs(lo), abs(hi), 1.0
        )
        # saturated regions are exact, and the result is not relu (which would be unbounded above)
        assert torch.equal(got[x <= lo], want[x <= lo]) and torch.equal(got[x >= hi], want[x >= hi])


def test_leaky_relu_patch_matches_leaky_relu() -> None:
    x = _inputs()[:-2]
    got, want = LeakyReluAsRelu(0.1)(x), nn.LeakyReLU(0.1)(x)
    assert float((got - want).abs().max()) <= 1e-5


def test_hardtanh_is_patched_only_for_targets_without_clip() -> None:
    net = CTRNet(ModelConfig(hidden1=8, hidden2=4, activation="hardtanh")).eval()
    same, none_applied = apply_patches(net, PROFILES["standard"])
    assert none_applied == [] and isinstance(same.get_submodule("layers.1"), nn.Hardtanh)

    patched, applied = apply_patches(net, PROFILES["minimal"])
    assert [(a.op, a.module) for a in applied] == [("Clip", "layers.1"), ("Clip", "layers.4")]
    assert [type(m).__name__ for m in patched.get_submodule("layers").children()] == [
        "Linear",
        "HardtanhAsRelu",
        "Dropout",
        "Linear",
        "HardtanhAsRelu",
        "Dropout",
        "Linear",
    ]
    assert isinstance(net.get_submodule("layers.1"), nn.Hardtanh)  # the original is untouched
    x = torch.randn(256, 128) * 5
    with torch.no_grad():
        assert float((patched(x) - net(x)).abs().max()) <= 1e-5


def test_every_patch_states_op_and_why() -> None:
    assert [p.op for p in PATCHES] == ["Clip", "LeakyRelu"]
    assert all(p.why for p in PATCHES)
