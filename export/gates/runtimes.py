"""Load each exported artifact as a batch predictor: float32 (N, width) -> ctr (N, 1).

The parity gate and the latency bench use the same loaders, so they measure what is published.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctr_contract.signatures import DEFAULT_SIGNATURE, INPUT_NAME, OUTPUT_NAME
from ctr_model.net import CTRProbability

PredictFn = Callable[[np.ndarray], np.ndarray]


def torch_predictor(net: nn.Module) -> PredictFn:
    """PyTorch eager: sigmoid(net(x)) under no_grad."""
    model = CTRProbability(net).eval()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(x)).numpy()

    return predict


def write_torchscript(net: nn.Module, width: int, path: Path) -> None:
    """Trace features (B, width) -> ctr (B, 1) into `model.pt` for TorchServe and Triton's PyTorch backend."""
    with warnings.catch_warnings():
        # torch 2.13 deprecates TorchScript, but it is the format those two servers load.
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(CTRProbability(net).eval(), torch.zeros(2, width))
        traced.save(str(path))


def torchscript_predictor(path: Path) -> PredictFn:
    """The traced `model.pt`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # see write_torchscript
        module = torch.jit.load(str(path), map_location="cpu").eval()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(x)).numpy()

    return predict


def onnxruntime_predictor(
    path: Path, input_name: str = INPUT_NAME, output_name: str = OUTPUT_NAME, threads: int | None = None
) -> PredictFn:
    """`model.onnx` in an ONNX Runtime CPU session (`threads` intra-op threads; None: ORT's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def predict(x: np.ndarray) -> np.ndarray:
        return session.run([output_name], {input_name: x})[0]

    return predict


def savedmodel_predictor(
    directory: Path, input_name: str = INPUT_NAME, output_name: str = OUTPUT_NAME
) -> PredictFn:
    """The SavedModel reloaded with `tf.saved_model.load`, called through `serving_default`."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(directory))
    signature = loaded.signatures[DEFAULT_SIGNATURE]

    def predict(x: np.ndarray) -> np.ndarray:
        return signature(**{input_name: tf.constant(x)})[output_name].numpy()

    predict.loaded = loaded  # type: ignore[attr-defined]  # keep the restored variables alive
    return predict
