"""The parity gate: PyTorch, ONNX Runtime and the SavedModel must agree on >= 10,000 rows, on every output.

Each backend gives the calibrated `ctr` and the network's `raw_score` side by side (export/gates/runtimes.py);
both are held to the tolerance, so the calibrator in each graph is checked with the network.

Rows are real validation rows, extreme rows that drive every activation into saturation, and
random rows to fill up. The report (max abs differences overall and per row group, plus how many
units each activation layer saw saturated) goes into the manifest.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ctr_contract.signatures import OUTPUT_NAME, OUTPUT_NAMES
from export.errors import ParityError

MIN_ROWS = 10_000
# Spec features are z-scores clipped to ±10, 0/1 indicators and hashed counts <= 26, so ±32 is beyond any real
# input and saturates every unit. Larger scales would only measure float32 cancellation in big logits.
EXTREME_SCALES = (4.0, 16.0, 32.0)
RANDOM_SIGN_ROWS = 256  # per scale


@dataclass
class ParityRows:
    """The parity inputs, float32 (N, width), with the row range of each group."""

    features: np.ndarray
    groups: dict[str, slice] = field(default_factory=dict)


def _extreme_rows(net: nn.Module, width: int, rng: np.random.Generator) -> np.ndarray:
    """Rows far outside the training range: all-±s, ±s along each first-layer unit's weights, random ±s.

    Returns:
        float32 (M, width).
    """
    first = next(m for m in net.modules() if isinstance(m, nn.Linear))
    w = first.weight.detach().numpy()  # (H, width): row j is the direction that drives unit j hardest
    unit_dirs = np.sign(w) + (w == 0)  # ±1 per feature, never 0
    parts = []
    for s in EXTREME_SCALES:
        parts += [np.full((1, width), s), np.full((1, width), -s), s * unit_dirs, -s * unit_dirs]
        parts.append(s * rng.choice([-1.0, 1.0], size=(RANDOM_SIGN_ROWS, width)))
    return np.concatenate(parts).astype(np.float32)


def build_rows(
    net: nn.Module, width: int, n_rows: int, validation: np.ndarray | None, seed: int = 0
) -> ParityRows:
    """Validation rows first, then extreme rows, then standard-normal rows up to `n_rows`.

    Args:
        net: the network (its first Linear layer aims the extreme rows).
        width: features per row.
        n_rows: total rows, at least MIN_ROWS.
        validation: float32 (V, width) real transformed rows, or None.
    """
    rng = np.random.default_rng(seed)
    extreme = _extreme_rows(net, width, rng)
    val = (
        validation[: max(0, n_rows - len(extreme))]
        if validation is not None
        else np.zeros((0, width), np.float32)
    )
    filler = rng.standard_normal((max(0, n_rows - len(val) - len(extreme)), width)).astype(np.float32)
    groups, start = {}, 0
    for name, block in (("validation", val), ("extreme", extreme), ("random", filler)):
        if len(block):
            groups[name] = slice(start, start + len(block))
            start += len(block)
    return ParityRows(np.concatenate([val, extreme, filler]).astype(np.float32), groups)


def saturation(net: nn.Module, features: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per activation layer: how many units saw inputs in each saturated region.

    ReLU saturates below 0 (output pinned at 0); Hardtanh below min_val and above max_val.
    """
    seen: dict[str, dict[str, Any]] = {}
    hooks = []
    for name, module in net.named_modules():
        if isinstance(module, nn.ReLU | nn.Hardtanh):
            lo, hi = (0.0, None) if isinstance(module, nn.ReLU) else (module.min_val, module.max_val)

            def record(
                _m: nn.Module, args: tuple[torch.Tensor, ...], _out: Any, name=name, lo=lo, hi=hi
            ) -> None:
                x = args[0]  # (N, units) pre-activations
                seen[name] = {
                    "activation": type(_m).__name__,
                    "units": int(x.shape[1]),
                    "saturated_low": int((x.min(0).values < lo).sum()),
                    "saturated_high": None if hi is None else int((x.max(0).values > hi).sum()),
                }

            hooks.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            net(torch.from_numpy(features))
    finally:
        for h in hooks:
            h.remove()
    return seen


def compare(
    rows: ParityRows,
    outputs: dict[str, np.ndarray],
    tolerance: float,
    reference: str = "pytorch",
    output_names: Sequence[str] = (OUTPUT_NAME,),
) -> dict[str, Any]:
    """Max abs difference between every pair of backends, overall and per row group, over every output.

    Args:
        rows: the inputs and their groups.
        outputs: backend name -> (N, len(output_names)) columns, `ctr` first.
        tolerance: the largest allowed difference.
        output_names: the columns' names.
    Returns:
        the parity report; `passed` is False on any difference above tolerance or any non-finite output.
        `max_abs_diff_by_pair` and `max_abs_diff_by_group` are the worst over the outputs, `by_output` each one's.
    """
    non_finite = {k: int((~np.isfinite(v)).sum()) for k, v in outputs.items()}
    pairs: dict[str, float] = {}
    by_group: dict[str, dict[str, float]] = {}
    by_output: dict[str, dict[str, Any]] = {name: {"max_abs_diff_by_pair": {}} for name in output_names}
    for a, b in itertools.combinations(outputs, 2):
        diff = np.abs(outputs[a].astype(np.float64) - outputs[b].astype(np.float64))  # (N, outputs)
        key = f"{a}_vs_{b}"
        for j, name in enumerate(output_names):
            by_output[name]["max_abs_diff_by_pair"][key] = float(diff[:, j].max())  # NaN propagates
        pairs[key] = float(diff.max())  # NaN propagates and fails the gate
        by_group[key] = {g: float(diff[s].max()) for g, s in rows.groups.items()}
    for entry in by_output.values():
        entry["max_abs_diff"] = float(np.max(list(entry["max_abs_diff_by_pair"].values())))
    worst = float(np.max(list(pairs.values())))
    ref = outputs[reference]
    return {
        "rows": len(rows.features),
        "groups": {g: s.stop - s.start for g, s in rows.groups.items()},
        "tolerance": tolerance,
        "outputs": list(output_names),
        "max_abs_diff": worst,
        "max_abs_diff_by_pair": pairs,
        "max_abs_diff_by_group": by_group,
        "by_output": by_output,
        "non_finite_outputs": non_finite,
        **{
            f"reference_{n}_range": [float(ref[:, j].min()), float(ref[:, j].max())]
            for j, n in enumerate(output_names)
        },
        "passed": worst <= tolerance and not any(non_finite.values()),
    }


def outputs_of(
    backends: dict[str, Callable[..., np.ndarray]], n_outputs: int, *inputs: np.ndarray
) -> dict[str, np.ndarray]:
    """Each backend's columns on the inputs, as (N, n_outputs) arrays."""
    return {name: np.asarray(fn(*inputs)).reshape(len(inputs[0]), n_outputs) for name, fn in backends.items()}


def run_gate(
    rows: ParityRows,
    backends: dict[str, Callable[[np.ndarray], np.ndarray]],
    tolerance: float,
    output_names: Sequence[str] = OUTPUT_NAMES,
) -> dict[str, Any]:
    """Run every backend on the rows and raise ParityError if they disagree on any output.

    Args:
        backends: name -> function float32 (N, width) -> (N, len(output_names)); the first is the reference.
    Returns:
        the report from `compare`.
    """
    outputs = outputs_of(backends, len(output_names), rows.features)
    report = compare(rows, outputs, tolerance, reference=next(iter(backends)), output_names=output_names)
    if not report["passed"]:
        raise ParityError(
            f"parity failed: max abs difference {report['max_abs_diff']:.3g} > tolerance {tolerance:.3g} "
            f"(by output and pair: { {k: v['max_abs_diff_by_pair'] for k, v in report['by_output'].items()} }, "
            f"non-finite outputs: {report['non_finite_outputs']}); "
            "nothing was published"
        )
    return report
