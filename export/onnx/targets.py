"""Target op sets: which ONNX ops the runtime that will load `model.onnx` accepts.

A target is a named profile or an explicit list. The export patches ops the target lacks
(see export/onnx/patches.py) and then checks the final ONNX graph against the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from export.errors import InputError

# Every op our ONNX -> TF translator covers (export/tf/tf_ops.py); the SavedModel needs all graph ops in here.
TRANSLATOR_OPS = frozenset(
    {
        "Gemm",
        "MatMul",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Relu",
        "LeakyRelu",
        "Clip",
        "Sigmoid",
        "Tanh",
        "Identity",
        "Dropout",
        "Constant",
        "Flatten",
        "Reshape",
        "Concat",
        "BatchNormalization",
        "Max",
        "Min",
    }
)

PROFILES: dict[str, frozenset[str]] = {
    # ONNX Runtime, Triton's onnxruntime backend and our translator: the full translator set.
    "standard": TRANSLATOR_OPS,
    # A conservative set like those of fixed-function NPU / MCU compilers: matmul, add/sub/mul, ReLU,
    # sigmoid and shape plumbing. No Clip, so Hardtanh must be patched into ReLUs.
    "minimal": frozenset(
        {
            "Gemm",
            "MatMul",
            "Add",
            "Sub",
            "Mul",
            "Relu",
            "Sigmoid",
            "Identity",
            "Constant",
            "Flatten",
            "Reshape",
        }
    ),
}
DEFAULT_PROFILE = "standard"


@dataclass(frozen=True)
class Target:
    """The op set an exported graph must stay within."""

    name: str
    ops: frozenset[str]

    def describe(self) -> str:
        return f"{self.name} [{', '.join(sorted(self.ops))}]"


def resolve_target(profile: str | None, explicit_ops: str | None) -> Target:
    """Build the target from `--target PROFILE` or `--target-ops A,B,C` (explicit list wins).

    Args:
        profile: a key of PROFILES, or None for the default.
        explicit_ops: comma-separated ONNX op types, or None.
    Returns:
        the Target.
    """
    if explicit_ops is not None:
        ops = frozenset(op.strip() for op in explicit_ops.split(",") if op.strip())
        if not ops:
            raise InputError(f"--target-ops {explicit_ops!r} lists no ops; expected e.g. 'Gemm,Relu,Sigmoid'")
        return Target("custom", ops)
    name = profile or DEFAULT_PROFILE
    if name not in PROFILES:
        raise InputError(f"unknown target profile {name!r}; expected one of {sorted(PROFILES)}")
    return Target(name, PROFILES[name])
