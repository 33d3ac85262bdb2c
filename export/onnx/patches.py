"""Op patches: rewrite modules whose ONNX op the target lacks into exact equivalents, before export.

One registry entry per ONNX op: the op, the torch module that emits it, the replacement and why.
A patch is applied only when the target op set lacks the op; the final ONNX graph is still checked.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class HardtanhAsRelu(nn.Module):
    """hardtanh(x) from Relu/Sub/Add only: min + relu((max - min) - relu(max - x)), no Clip.

    This is relu(x - min) - relu(x - max) + min with the two relus nested instead of subtracted. The flat
    form cancels catastrophically once x - min and x - max round to the same float32 (x above about
    2**24 * (max - min) / 2) and then returns min where hardtanh gives max; the nested form gives both
    saturated values bit for bit at any magnitude and the identity region within float32 rounding.
    """

    def __init__(self, min_val: float, max_val: float) -> None:
        super().__init__()
        self.min_val = float(min_val)
        self.max_val = float(max_val)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x >= max: relu(max - x) = 0 -> min + (max - min) = max
        # x <= min: (max - min) - (max - x) <= 0 -> min + 0 = min
        # between:  min + (max - min) - (max - x) = x
        span = self.max_val - self.min_val
        return torch.relu(span - torch.relu(self.max_val - x)) + self.min_val

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class LeakyReluAsRelu(nn.Module):
    """leaky_relu(x) = slope * x + (1 - slope) * relu(x): Relu/Mul/Add only, no LeakyRelu."""

    def __init__(self, negative_slope: float) -> None:
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x < 0: slope * x + 0;  x >= 0: slope * x + (1 - slope) * x = x (no Neg op, which minimal targets lack)
        return self.negative_slope * x + (1.0 - self.negative_slope) * torch.relu(x)


@dataclass(frozen=True)
class OpPatch:
    """One registry entry: which ONNX op it removes, from which module type, and why it is safe."""

    op: str
    module_type: type[nn.Module]
    replacement: Callable[[nn.Module], nn.Module]
    why: str


def _hardtanh(m: nn.Module) -> nn.Module:
    assert isinstance(m, nn.Hardtanh)
    return HardtanhAsRelu(m.min_val, m.max_val)


def _leaky_relu(m: nn.Module) -> nn.Module:
    assert isinstance(m, nn.LeakyReLU)
    return LeakyReluAsRelu(m.negative_slope)


PATCHES: tuple[OpPatch, ...] = (
    OpPatch(
        op="Clip",
        module_type=nn.Hardtanh,  # also covers nn.ReLU6, a Hardtanh subclass
        replacement=_hardtanh,
        why="targets without Clip: min + relu((max-min) - relu(max-x)), i.e. relu(x-min) - relu(x-max) + min "
        "nested so it cannot cancel for large |x|, equals hardtanh (saturated values exactly, the identity "
        "region within float32 rounding); replacing Hardtanh by ReLU instead would change the model's outputs",
    ),
    OpPatch(
        op="LeakyRelu",
        module_type=nn.LeakyReLU,
        replacement=_leaky_relu,
        why="targets without LeakyRelu: slope*x + (1-slope)*relu(x) equals leaky_relu (within one float32 rounding)",
    ),
)


@dataclass(frozen=True)
class AppliedPatch:
    """A patch applied to one submodule, for the manifest."""

    op: str
    module: str
    replacement: str
    why: str


def apply_patches(model: nn.Module, target_ops: frozenset[str]) -> tuple[nn.Module, list[AppliedPatch]]:
    """Return a patched deep copy of `model` for a target op set, and what was replaced.

    Args:
        model: the eval-mode network (left untouched).
        target_ops: ONNX op types the target accepts.
    Returns:
        (patched copy, applied patches in module order).
    """
    patched = copy.deepcopy(model)
    applied: list[AppliedPatch] = []
    needed = [p for p in PATCHES if p.op not in target_ops]
    # Snapshot the names first: we replace children while walking.
    for name, module in list(patched.named_modules()):
        patch = next((p for p in needed if isinstance(module, p.module_type)), None)
        if patch is None or not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = patched.get_submodule(parent_name) if parent_name else patched
        new = patch.replacement(module)
        setattr(parent, child, new)
        applied.append(AppliedPatch(patch.op, name, repr(new), patch.why))
    return patched.eval(), applied
