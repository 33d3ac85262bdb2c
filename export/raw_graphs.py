"""The `raw` signature's two graphs for a published version, built by the feature package's builders.

ctr_features/compiled/onnx_graph.py and ctr_features/compiled/tf_graph.py hold the FeatureSpec as ONNX and
TF ops; here export composes them with its model: `model_raw.onnx` (the spec nodes, then the exported model
graph) and the SavedModel's `raw` signature (the spec in TF, then the ONNX -> TF translation of the model,
export/tf/translator.py). A graph the builders refuse is an `ExportError` with the builder's message, so the
command line prints it as one `error:` line and nothing is published.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from ctr_features.compiled import onnx_graph
from ctr_features.errors import FeatureGraphError
from ctr_features.spec import FeatureSpec
from export.errors import ExportError


def build_raw_model(model: onnx.ModelProto, spec: FeatureSpec) -> onnx.ModelProto:
    """`onnx_graph.build_raw_model`: the checked raw model, the 39 fields -> ctr; ExportError if it cannot."""
    try:
        return onnx_graph.build_raw_model(model, spec)
    except FeatureGraphError as e:
        raise ExportError(str(e)) from e


def save_saved_model_with_raw(proto: onnx.ModelProto, spec: FeatureSpec, directory: Path) -> None:
    """Translate `proto` and write a SavedModel with `serving_default` (features) and `raw` (the 39 fields).

    TensorFlow is imported here, not with the module: export loads it only once the ONNX steps passed."""
    from ctr_features.compiled.tf_graph import save_with_raw
    from export.tf.translator import OnnxModule

    save_with_raw(OnnxModule(proto), spec, directory)
