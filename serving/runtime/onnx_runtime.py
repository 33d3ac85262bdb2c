"""ONNX Runtime backend: `<version>/model.onnx`, one session per version."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ctr_contract.repository import RAW_ONNX_MODEL
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS, RAW_FIELDS
from serving.errors import ModelLoadError
from serving.signatures import OUTPUT_NAME, Signature, output_order

# Also off through the API: ORT_DISABLE_TELEMETRY (serving/__init__.py) is the full opt-out, this stops events.
ort.disable_telemetry_events()


# ONNX Runtime's CPU arena (a BFC arena per session) keeps every block a run ever took until the session is
# released, so a burst of large batches stays resident for the version's life; off, each run's tensors come
# from malloc and go back at once (and a released session leaves nothing either way). Off costs nothing
# measurable per request: docs/perf/serving-memory.md.
CPU_ARENA = False


def _static_dim(dim: object) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def session_options(intra_op_threads: int, arena: bool = CPU_ARENA) -> ort.SessionOptions:
    """The options of every session: a fixed thread budget, no spinning, and the CPU arena `arena`."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning threads would burn the cores the event loop needs between requests.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.enable_cpu_mem_arena = arena
    return opts


class OnnxRuntimeBackend:
    """Runs model.onnx on the CPU execution provider with a fixed thread budget."""

    runtime = "ONNXRuntime"

    def __init__(self, model_path: Path, intra_op_threads: int, arena: bool = CPU_ARENA) -> None:
        if not model_path.is_file():
            raise ModelLoadError(f"{model_path} does not exist")
        opts = session_options(intra_op_threads, arena)
        try:
            self._session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types for corrupt/invalid graphs
            raise ModelLoadError(f"ONNX Runtime cannot load {model_path}: {exc}") from exc
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        names = [o.name for o in outputs]
        order = names if len(names) == 1 else output_order(names)
        if len(inputs) != 1 or order is None:
            raise ModelLoadError(
                f"{model_path} must have 1 input and 1 output (or several, one of them '{OUTPUT_NAME}'), got "
                f"inputs {[i.name for i in inputs]} and outputs {names}"
            )
        inp = inputs[0]
        width = _static_dim(inp.shape[-1]) if len(inp.shape) == 2 else None
        widths = {_static_dim(o.shape[-1]) if len(o.shape) == 2 else None for o in outputs}
        output_width = widths.pop() if len(widths) == 1 else None
        if inp.type != "tensor(float)" or width is None or output_width is None:
            raise ModelLoadError(
                f"{model_path} must map float [N, F] to outputs [N, K] of one K; got {inp.type} {inp.shape} -> "
                f"{[o.shape for o in outputs]}"
            )
        self._outputs = list(order)  # run in serving order: `ctr` first
        # The `raw` signature: model_raw.onnx beside model.onnx (versions exported before it have none).
        raw_path = model_path.with_name(RAW_ONNX_MODEL)
        self._raw_session = None
        if raw_path.is_file():
            try:
                self._raw_session = ort.InferenceSession(
                    str(raw_path), opts, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # as above: ORT's own exception types
                raise ModelLoadError(f"ONNX Runtime cannot load {raw_path}: {exc}") from exc
            fields = sorted(i.name for i in self._raw_session.get_inputs())
            if fields != sorted(RAW_FIELDS):
                raise ModelLoadError(
                    f"{raw_path} takes inputs {fields}; expected the Criteo fields I1..I13, C1..C26"
                )
            raw_names = [o.name for o in self._raw_session.get_outputs()]
            if sorted(raw_names) != sorted(order):
                raise ModelLoadError(
                    f"{raw_path} has outputs {raw_names}, {model_path.name} has {names}; the two graphs of a "
                    "version serve the same outputs: re-export the version"
                )
            # One all-missing row: a graph that cannot run fails the load, and the first request is warm.
            row = {f: np.full(1, np.nan) for f in NUMERIC_FIELDS} | {
                f: np.array([""], object) for f in CATEGORICAL_FIELDS
            }
            try:
                self._raw_session.run(self._outputs, row)
            except Exception as exc:  # ORT's own exception types
                raise ModelLoadError(
                    f"ONNX Runtime cannot run {raw_path} on an all-missing row: {exc}"
                ) from exc
        self.signature = Signature(
            inp.name, order[0], width, output_width, self._raw_session is not None, tuple(order[1:])
        )
        self._single = len(order) == 1

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(N, F) float32 -> (N, K) float32, or (N, k * K) with k outputs side by side (serving/signatures.py)."""
        outs = self._session.run(self._outputs, {self.signature.input_name: features})
        return outs[0] if self._single else np.concatenate(outs, axis=1)

    def predict_raw(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The 39 raw fields, each (N,) -> the scores of `predict`."""
        assert self._raw_session is not None, "predict_raw needs model_raw.onnx (signature.has_raw)"
        outs = self._raw_session.run(self._outputs, inputs)
        return outs[0] if self._single else np.concatenate(outs, axis=1)
