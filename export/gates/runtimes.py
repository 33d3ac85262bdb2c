"""Load each exported artifact as a batch predictor: float32 (N, width) -> (N, len(outputs)).

A predictor returns the columns of the named outputs side by side: by default `ctr` alone, (N, 1), what the
quality gate, the drift reference, the online loop and the latency bench score; the parity gate asks for
`OUTPUT_NAMES` (ctr, raw_score) and compares each column. The parity gate and the latency bench use the same
loaders, so they measure what is published.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctr_contract.signatures import DEFAULT_SIGNATURE, INPUT_NAME, OUTPUT_NAME, OUTPUT_NAMES
from ctr_model.calibration import CalibratedNet, Calibrator

PredictFn = Callable[[np.ndarray], np.ndarray]
NO_CALIBRATION = Calibrator("none")  # ctr = sigmoid(z): the network's own probability


def _columns(by_name: dict[str, np.ndarray], outputs: Sequence[str]) -> np.ndarray:
    """The named outputs (each (N, 1) or (N,)) as float32 columns (N, len(outputs))."""
    return np.concatenate([np.asarray(by_name[n], np.float32).reshape(-1, 1) for n in outputs], axis=1)


def torch_predictor(
    net: nn.Module, calibrator: Calibrator = NO_CALIBRATION, outputs: Sequence[str] = (OUTPUT_NAME,)
) -> PredictFn:
    """PyTorch eager: `CalibratedNet(net, calibrator)` under no_grad (the parity gate's reference)."""
    model = CalibratedNet(net, calibrator).eval()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            ctr, raw = model(torch.from_numpy(x))
        return _columns({OUTPUT_NAMES[0]: ctr.numpy(), OUTPUT_NAMES[1]: raw.numpy()}, outputs)

    return predict


def write_torchscript(net: nn.Module, width: int, path: Path, calibrator: Calibrator) -> None:
    """Trace features (B, width) -> (ctr (B, 1), raw_score (B, 1)) into `model.pt` for TorchServe and Triton's
    PyTorch backend: the network and its calibrator, as in `model.onnx`."""
    with warnings.catch_warnings():
        # torch 2.13 deprecates TorchScript, but it is the format those two servers load.
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(CalibratedNet(net, calibrator).eval(), torch.zeros(2, width))
        traced.save(str(path))


def torchscript_predictor(path: Path, outputs: Sequence[str] = (OUTPUT_NAME,)) -> PredictFn:
    """The traced `model.pt` (its tuple in OUTPUT_NAMES order)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # see write_torchscript
        module = torch.jit.load(str(path), map_location="cpu").eval()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            result = module(torch.from_numpy(x))
        return _columns(dict(zip(OUTPUT_NAMES, (t.numpy() for t in result), strict=True)), outputs)

    return predict


def onnxruntime_predictor(
    path: Path,
    input_name: str = INPUT_NAME,
    output_name: str = OUTPUT_NAME,
    threads: int | None = None,
    outputs: Sequence[str] | None = None,
) -> PredictFn:
    """`model.onnx` in an ONNX Runtime CPU session (`threads` intra-op threads; None: ORT's default).

    `outputs` (default: `output_name` alone) names the columns; a version exported before `raw_score` has `ctr`.
    """
    import onnxruntime as ort

    names = list(outputs) if outputs is not None else [output_name]
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    if len(names) == 1:
        return lambda x: session.run(names, {input_name: x})[0]
    return lambda x: _columns(dict(zip(names, session.run(names, {input_name: x}), strict=True)), names)


def savedmodel_predictor(
    directory: Path,
    input_name: str = INPUT_NAME,
    output_name: str = OUTPUT_NAME,
    outputs: Sequence[str] | None = None,
) -> PredictFn:
    """The SavedModel reloaded with `tf.saved_model.load`, called through `serving_default`."""
    import tensorflow as tf

    names = list(outputs) if outputs is not None else [output_name]
    loaded = tf.saved_model.load(str(directory))
    signature = loaded.signatures[DEFAULT_SIGNATURE]

    def predict(x: np.ndarray) -> np.ndarray:
        result = signature(**{input_name: tf.constant(x)})
        if len(names) == 1:
            return result[names[0]].numpy()
        return _columns({n: result[n].numpy() for n in names}, names)

    predict.loaded = loaded  # type: ignore[attr-defined]  # keep the restored variables alive
    return predict
