"""The raw-signature parity gate: the Python path, the ONNX raw graph and the SavedModel's `raw` signature
must agree within the tolerance on >= 10,000 raw Criteo rows, on both outputs (ctr, raw_score).

The Python path is what training does: `FeatureSpec.transform` then the PyTorch model. Rows are the run's
validation rows (`val_raw.npz`) and the feature parity harness's groups (ctr_features/parity.py), which stress
every branch of the transform: values from the vocabularies and rate tables, unseen values, all-missing
rows, negative and huge counts (Criteo has -1 and counts over 1e6; ±Inf and NaN are missing), empty and
non-ASCII strings. On the same rows the harness first checks the compiled forms export does not publish as
graphs (training's record encoders, serving's compiled table) against `FeatureSpec.transform`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.signatures import OUTPUT_NAMES, RAW_SIGNATURE
from ctr_features.errors import FeatureParityError
from ctr_features.layout import N_CAT, N_NUM
from ctr_features.parity import RawRows, check_forms, compiled_forms, raw_feed, table_form
from ctr_features.spec import FeatureSpec
from export.errors import InputError, ParityError
from export.gates.parity import MIN_ROWS, ParityRows, compare, outputs_of

log = logging.getLogger(__name__)
RawPredictFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # raw rows -> (N, outputs) columns
# The compiled forms the gate checks at the features (the ONNX and TF forms are checked as the published
# graphs, below).
GATE_FORMS = ("records", "arrow_records", "table")


def load_val_raw(path: Path | None) -> RawRows | None:
    """Read `val_raw.npz` (numeric float64 [V, 13], categorical str [V, 26]); None when there is none."""
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            numeric, categorical = z["numeric"].astype(np.float64), z["categorical"]
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"cannot read raw validation rows {path}: {e}") from e
    n = len(numeric)
    if numeric.shape != (n, N_NUM) or categorical.shape != (n, N_CAT):
        raise InputError(
            f"raw validation rows {path} have shapes {list(numeric.shape)} and {list(categorical.shape)}; "
            f"expected [N, {N_NUM}] and [N, {N_CAT}]"
        )
    if categorical.dtype.kind != "U":
        raise InputError(
            f"raw validation rows {path}: categorical has dtype {categorical.dtype}, expected str"
        )
    return numeric, categorical.astype(object)


def python_predictor(
    spec: FeatureSpec, features_predictor: Callable[[np.ndarray], np.ndarray]
) -> RawPredictFn:
    """FeatureSpec.transform followed by the (PyTorch) features predictor."""
    return lambda numeric, categorical: features_predictor(spec.transform(numeric, categorical))


def serving_predictor(
    spec: FeatureSpec, features_predictor: Callable[[np.ndarray], np.ndarray]
) -> RawPredictFn:
    """Our server's compiled FeatureSpec (ctr_features/compiled/table.py: native few-row, Python one-row or
    numpy), then the features model (`model.onnx` in ONNX Runtime).

    The rows go in requests of `ctr_features.parity.SERVED_SIZES` rows in turn, as RawBatches in the forms the
    server's decoders make (`ctr_features.parity.table_form`), twice: the first pass fills the one-row z-score
    cache, the second runs from it, and the two must agree bit for bit. The server's REST decoding of the
    same rows is checked by serving's own tests and warm-up, not here: export does not import serving."""
    transform = table_form(spec)

    def predict(numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        try:
            features = transform(numeric, categorical)
        except FeatureParityError as e:
            raise ParityError(str(e)) from e
        return features_predictor(features)

    return predict


def onnxruntime_raw_predictor(
    path: Path, threads: int | None = None, outputs: Sequence[str] = OUTPUT_NAMES[:1]
) -> RawPredictFn:
    """`model_raw.onnx` in an ONNX Runtime CPU session: the named outputs side by side (default: ctr)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = list(outputs)
    return lambda numeric, categorical: np.concatenate(
        session.run(names, raw_feed(numeric, categorical)), axis=1
    )


def savedmodel_raw_predictor(directory: Path, outputs: Sequence[str] = OUTPUT_NAMES[:1]) -> RawPredictFn:
    """The SavedModel reloaded with `tf.saved_model.load`, called through its `raw` signature."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(directory))
    signature = loaded.signatures[RAW_SIGNATURE]

    def predict(numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        feed = raw_feed(numeric, categorical)
        tensors = {k: tf.constant(v.tolist() if v.dtype == object else v) for k, v in feed.items()}
        result = signature(**tensors)
        return np.concatenate([result[n].numpy().reshape(-1, 1) for n in outputs], axis=1)

    predict.loaded = loaded  # type: ignore[attr-defined]  # keep the restored tables alive
    return predict


def run_raw_gate(
    spec: FeatureSpec,
    rows: RawRows,
    groups: dict[str, slice],
    backends: dict[str, RawPredictFn],
    tolerance: float,
    output_names: Sequence[str] = OUTPUT_NAMES,
) -> dict[str, Any]:
    """Run every raw backend on the rows; raise ParityError if they disagree on any of `output_names`.

    Returns:
        the report from `export.gates.parity.compare`, over the rows' transformed features.
    """
    if len(rows[0]) < MIN_ROWS:
        raise ParityError(f"raw parity needs >= {MIN_ROWS} rows, got {len(rows[0])}")
    try:
        features = check_forms(spec, rows, groups, compiled_forms(spec, GATE_FORMS), tolerance)
    except FeatureParityError as e:
        raise ParityError(f"{e}; nothing was published") from e
    log.info(
        "compiled FeatureSpec forms agree: %s", {k: v["max_abs_diff"] for k, v in features["forms"].items()}
    )
    outputs = outputs_of(backends, len(output_names), *rows)
    report = compare(
        ParityRows(spec.transform(*rows), groups),
        outputs,
        tolerance,
        reference=next(iter(backends)),
        output_names=output_names,
    )
    if not report["passed"]:
        raise ParityError(
            f"raw-signature parity failed: max abs difference {report['max_abs_diff']:.3g} > tolerance "
            f"{tolerance:.3g} (by pair: {report['max_abs_diff_by_pair']}, by group: "
            f"{report['max_abs_diff_by_group']}, non-finite outputs: {report['non_finite_outputs']}); "
            "nothing was published"
        )
    return report
