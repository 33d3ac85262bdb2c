"""PyTorch -> a single self-contained `model.onnx`, checked for opset, I/O contract and target op set.

The graph is the network followed by its calibrator (`ctr_model.calibration.CalibratedNet`): features -> the
calibrated `ctr` and the network's own `raw_score`, so every runtime that loads the file serves calibrated
probabilities.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from ctr_contract import signatures as contract
from ctr_model.calibration import CalibratedNet, Calibrator
from ctr_model.net import CTRNet
from export.errors import ExportError, UnsupportedOpError
from export.onnx.patches import PATCHES
from export.onnx.targets import Target

log = logging.getLogger(__name__)

INPUT_NAME = contract.INPUT_NAME
OUTPUT_NAME = contract.OUTPUT_NAME
OUTPUT_NAMES = contract.OUTPUT_NAMES  # ctr, raw_score
BATCH_DIM = "batch"


def export_onnx(
    net: CTRNet | nn.Module,
    width: int,
    path: Path,
    opset: int,
    calibrator: Calibrator = Calibrator("none"),  # noqa: B008  # frozen: ctr = the network's probability
) -> onnx.ModelProto:
    """Export features (B, width) -> ctr (B, 1), raw_score (B, 1) to one ONNX file without external data.

    Args:
        net: eval-mode network returning logits (B, 1); the calibrator (and the sigmoid) are added here.
        width: number of input features (128 for the contract).
        path: destination file; nothing is written beside it.
        opset: the ai.onnx opset the result must carry.
        calibrator: maps the logits to `ctr` inside the graph (`none`: sigmoid(z + ln w); the default, with
            w = 1, makes ctr = raw_score).
    Returns:
        the loaded, checked model.
    """
    model = CalibratedNet(net, calibrator).eval()
    example = torch.zeros(2, width)  # batch 2: a batch of 1 can get specialised to a static dim
    chatter = io.StringIO()
    # The dynamo exporter (the non-deprecated path) prints progress to stdout and warns about
    # unrelated torchvision ops; keep our CLI output to what the user asked for.
    # The opset 18 -> 17 down-conversion notice from onnxscript is expected; we verify the opset ourselves.
    quiet = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(chatter), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (example,),
                str(path),
                input_names=[INPUT_NAME],
                output_names=list(OUTPUT_NAMES),
                opset_version=opset,
                dynamo=True,
                external_data=False,  # the default (True) writes weights to a side file
                dynamic_shapes={INPUT_NAME: {0: torch.export.Dim(BATCH_DIM)}},
                verbose=False,
            )
    except Exception as e:  # the exporter raises many types; surface them as one export failure
        raise ExportError(f"torch.onnx.export failed for opset {opset}: {e}") from e
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    log.debug("torch.onnx exporter output:\n%s", chatter.getvalue())
    side_files = [p.name for p in path.parent.iterdir() if p != path and p.name.startswith(path.name)]
    if side_files:
        raise ExportError(
            f"ONNX export wrote external data files {side_files}; expected one self-contained file"
        )
    proto = onnx.load(str(path), load_external_data=False)
    verify_contract(proto, width, opset)
    onnx.checker.check_model(proto, full_check=True)  # the loaded proto: no second read of the file
    return proto


def graph_opset(proto: onnx.ModelProto) -> int | None:
    """The ai.onnx opset version the model imports, or None."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def _dims(value: onnx.ValueInfoProto) -> list[str | int]:
    shape = value.type.tensor_type.shape
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in shape.dim]


def verify_contract(proto: onnx.ModelProto, width: int, opset: int) -> None:
    """Check opset, weights inline, and I/O: features float32 [batch, width] -> ctr, raw_score float32 [batch, 1]."""
    got = graph_opset(proto)
    if got != opset:
        # The exporter may silently keep a newer opset when down-conversion fails.
        raise ExportError(f"exported ONNX carries opset {got}, expected {opset}")
    external = [t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ExportError(f"initializers {external} use external data; expected them inline")
    g = proto.graph
    ios = {"input": list(g.input), "output": list(g.output)}
    expected = {"input": ((INPUT_NAME,), [BATCH_DIM, width]), "output": (OUTPUT_NAMES, [BATCH_DIM, 1])}
    for kind, values in ios.items():
        names, dims = expected[kind]
        if [v.name for v in values] != list(names):
            raise ExportError(f"ONNX graph {kind}s are {[v.name for v in values]}, expected {list(names)}")
        for v in values:
            if v.type.tensor_type.elem_type != onnx.TensorProto.FLOAT or _dims(v) != dims:
                raise ExportError(
                    f"ONNX {kind} {v.name!r} is {onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)} "
                    f"{_dims(v)}, expected FLOAT {dims}"
                )


def check_target_ops(proto: onnx.ModelProto, target: Target) -> list[str]:
    """Fail on the first node whose op the target lacks; return the sorted op types used.

    Raises:
        UnsupportedOpError: naming the op, the node and the target's op set.
    """
    for node in proto.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in target.ops:
            op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
            patch = next((p for p in PATCHES if p.op == op), None)
            hint = (
                f"its patch for {patch.module_type.__name__} did not remove it (is it a functional call?)"
                if patch
                else f"no patch in export/onnx/patches.py rewrites it (patched ops: {[p.op for p in PATCHES]})"
            )
            raise UnsupportedOpError(
                f"ONNX op {op!r} (node {node.name!r}) is not supported by target {target.describe()}; {hint}"
            )
    return sorted({n.op_type for n in proto.graph.node})
