"""The FeatureSpec as ONNX ops, composed with the model graph into `model_raw.onnx`: Criteo fields -> the
model's outputs (ctr, raw_score).

Inputs are the 39 raw fields, each 1-D with the batch as its only dimension: I1..I13 double (NaN or ±Inf =
missing, as `FeatureSpec.transform` treats them) and C1..C26 string ("" = missing). Only the `ai.onnx` and
`ai.onnx.ml` domains are used (LabelEncoder for the string tables), so ONNX Runtime and Triton's onnxruntime
backend run it with no custom op. Everything is field-major, (fields, N), until one Transpose:

    I* (N,) x13 -> (13, N) -> where(missing, 0, sign(x) * log(1 + |x|)) -> z-score -> clip -> float
                           -> missing indicators (13, N)
    C* (N,) x26 -> (26N,) -> LabelEncoder(value -> position g among all fields' values)
                -> (26, N) -> LabelEncoder(g * 26 + field -> table row) -> Gather lift (26, N)
                                                                        -> Gather bucket (OOV when absent)
    concat (HASH_START, N) -> Transpose (N, HASH_START);  identity-matrix rows of the buckets summed over
    fields (N, width - HASH_START)
    concat -> features (N, width) -> the model graph -> ctr (N, 1), raw_score (N, 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_contract.signatures import INPUT_NAME, OUTPUT_NAME, OUTPUT_NAMES
from ctr_features.errors import FeatureGraphError
from ctr_features.layout import N_CAT
from ctr_features.spec import FeatureSpec

ML_DOMAIN = "ai.onnx.ml"
MIN_OPSET = 13
ML_OPSET = 2  # LabelEncoder-2: string keys to float or int64 values, with a default
BATCH_DIM = "batch"
FEATURES_IR_VERSION = 8  # `features_model`'s: ONNX Runtime releases since 1.10 read it
PREFIX = "spec/"  # every value and node of the FeatureSpec part; the model graph's names stay as exported


def _strings(values: np.ndarray) -> list[str]:
    return [v.decode("utf-8") for v in values]


class _Graph:
    """Collects nodes and initializers under PREFIX."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), PREFIX + name))
        return PREFIX + name

    def node(self, op: str, inputs: list[str], out: str, domain: str = "", **attrs: Any) -> str:
        name = out if out == INPUT_NAME else PREFIX + out
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, domain=domain, **attrs))
        return name


def field_entries(spec: FeatureSpec) -> list[tuple[int, str, float, int]]:
    """(field index, value, lift or 0.0, bucket or `buckets` = OOV) for each value any table of a field holds."""
    entries = []
    for j, table in enumerate(spec.tables):
        lift = dict(zip(_strings(table.rate_values), table.lift.tolist(), strict=True))
        bucket = dict(zip(_strings(table.vocab), table.bucket.tolist(), strict=True))
        for value in sorted(lift.keys() | bucket.keys()):
            entries.append((j, value, lift.get(value, 0.0), bucket.get(value, spec.buckets)))
    return entries


def field_tables(spec: FeatureSpec) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 26 fields' lookups as two flat tables, so two LabelEncoders serve every field.

    Returns:
        values: every distinct value of any field's tables (the first lookup: value -> its position g);
        pair_keys: g * 26 + field for each (field, value) with an entry (the second lookup: -> row);
        rows: the row of each pair key; lift float32 and bucket int64 per row, plus a last row (lift 0,
        bucket = out of vocabulary) for every pair without an entry.
    """
    entries = field_entries(spec)
    values = sorted({e[1] for e in entries}) or [""]
    position = {v: g for g, v in enumerate(values)}
    pair_keys = np.array([position[v] * N_CAT + j for j, v, _, _ in entries], np.int64)
    lift = np.array([e[2] for e in entries] + [0.0]).astype(np.float32)
    bucket = np.array([e[3] for e in entries] + [spec.buckets], np.int64)
    if len(lift) >= 2**24:  # rows travel as float32 between the two lookups
        raise FeatureGraphError(
            f"the spec's tables hold {len(lift)} entries; the raw graph takes at most {2**24 - 1}"
        )
    return values, pair_keys, np.arange(len(entries), dtype=np.float32), lift, bucket


def categorical_nodes(g: _Graph, spec: FeatureSpec) -> tuple[str, str]:
    """C1..C26 (N,) -> (lifts float (N, 26), bucket index int64 (N, 26); index `buckets` = out of vocabulary).

    Each LabelEncoder node has a fixed cost per call in ORT, so the fields share two lookups instead of two each:
    value -> g (its position among all fields' values, -1 unseen), then g * 26 + field -> table row.
    """
    values, pair_keys, rows, lift, bucket = field_tables(spec)
    flat = g.node("Concat", list(CATEGORICAL_FIELDS), "categorical_flat", axis=0)  # (26N,) field-major
    position = g.node(
        "LabelEncoder",
        [flat],
        "value_position",
        domain=ML_DOMAIN,
        keys_strings=values,
        values_int64s=list(range(len(values))),
        default_int64=-1,
    )
    by_field = g.node(
        "Reshape", [position, g.const("fields_by_n", np.array([N_CAT, -1], np.int64))], "position_by_field"
    )
    field_id = g.const("field_id", np.arange(N_CAT, dtype=np.int64).reshape(N_CAT, 1))
    scaled = g.node("Mul", [by_field, g.const("n_fields", np.array(N_CAT, np.int64))], "position_scaled")
    pair = g.node("Add", [scaled, field_id], "pair_key")  # (26, N); negative for an unseen value
    row = g.node(
        "LabelEncoder",
        [pair],
        "table_row_float",
        domain=ML_DOMAIN,
        keys_int64s=pair_keys.tolist(),
        values_floats=rows.tolist(),
        default_float=float(len(rows)),
    )
    row = g.node("Cast", [row], "table_row", to=TensorProto.INT64)
    lifts = g.node("Gather", [g.const("lift_table", lift), row], "lifts_by_field")
    index = g.node("Gather", [g.const("bucket_table", bucket), row], "bucket_by_field")
    return lifts, index


def _field_major(g: _Graph, columns: list[str], out: str) -> str:
    """1-D (N,) columns -> (len(columns), N): one Concat and one Reshape whatever their number."""
    flat = g.node("Concat", columns, f"{out}_flat", axis=0)
    return g.node("Reshape", [flat, g.const(f"{out}_shape", np.array([len(columns), -1], np.int64))], out)


def spec_nodes(spec: FeatureSpec) -> _Graph:
    """The FeatureSpec as nodes: the 39 field inputs -> `features` float (N, width)."""
    g = _Graph()
    # Field-major (fields, N) throughout; one Transpose at the end (ORT's Transpose and ScatterElements
    # cost more than the arithmetic here, so there are as few of them as the layout allows).
    x = _field_major(g, list(NUMERIC_FIELDS), "numeric")  # (13, N) double
    nan = g.node("IsNaN", [x], "is_nan")
    inf = g.node("IsInf", [x], "is_inf")
    missing = g.node("Or", [nan, inf], "missing")
    zero, one = g.const("zero", np.array(0.0)), g.const("one", np.array(1.0))
    xc = g.node("Where", [missing, zero, x], "present")
    log = g.node("Log", [g.node("Add", [g.node("Abs", [xc], "abs"), one], "abs_plus_1")], "log1p")
    v = g.node("Mul", [g.node("Sign", [xc], "sign"), log], "signed_log1p")
    mean, std = g.const("mean", np.array(spec.mean)[:, None]), g.const("std", np.array(spec.std)[:, None])
    z = g.node("Div", [g.node("Sub", [v, mean], "centred"), std], "z")
    z = g.node("Where", [missing, zero, z], "z_present")
    lo, hi = g.const("clip_lo", np.array(-spec.clip)), g.const("clip_hi", np.array(spec.clip))
    z = g.node("Max", [g.node("Min", [z, hi], "z_hi"), lo], "z_clipped")
    z32 = g.node("Cast", [z], "z_float", to=TensorProto.FLOAT)
    indicators = g.node("Cast", [missing], "indicators", to=TensorProto.FLOAT)

    lift, index = categorical_nodes(g, spec)  # (26, N) float, (26, N) int64 in [0, buckets]
    dense = g.node("Concat", [z32, indicators, lift], "dense_by_field", axis=0)  # (HASH_START, N)
    dense = g.node("Transpose", [dense], "dense", perm=[1, 0])  # (N, HASH_START)
    # Bucket counts (N, buckets + 1): rows of an identity matrix, summed over the fields. In ORT this Gather
    # (a row copy per value) is cheaper than OneHot or ScatterElements(add) at serving batch sizes.
    eye = g.const("bucket_eye", np.eye(spec.buckets + 1, dtype=np.float32))
    onehot = g.node("Gather", [eye, index], "bucket_onehot")  # (26, N, buckets + 1)
    fields_axis = g.const("fields_axis", np.array([0], np.int64))
    counts = g.node("ReduceSum", [onehot, fields_axis], "bucket_counts", keepdims=0)
    g.node("Concat", [dense, counts], INPUT_NAME, axis=1)
    return g


def features_model(spec: FeatureSpec) -> onnx.ModelProto:
    """The FeatureSpec nodes alone as a checked model: the 39 fields -> `features` float (batch, width).

    What the raw graph computes before the model graph; the parity harness (ctr_features/parity.py) runs it.
    """
    g = spec_nodes(spec)
    output = helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [BATCH_DIM, spec.width])
    graph = helper.make_graph(g.nodes, "ctr_features", raw_inputs(), [output], initializer=g.inits)
    opsets = [helper.make_opsetid("", MIN_OPSET), helper.make_opsetid(ML_DOMAIN, ML_OPSET)]
    model = helper.make_model(
        graph, opset_imports=opsets, producer_name="ctr-pipeline ctr_features.compiled.onnx_graph"
    )
    model.ir_version = FEATURES_IR_VERSION
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as e:
        raise FeatureGraphError(f"the raw graph does not check: {e}") from e
    return model


def raw_inputs() -> list[onnx.ValueInfoProto]:
    """The 39 graph inputs: I* double (batch,), C* string (batch,)."""
    return [helper.make_tensor_value_info(f, TensorProto.DOUBLE, [BATCH_DIM]) for f in NUMERIC_FIELDS] + [
        helper.make_tensor_value_info(f, TensorProto.STRING, [BATCH_DIM]) for f in CATEGORICAL_FIELDS
    ]


def build_raw_model(model: onnx.ModelProto, spec: FeatureSpec) -> onnx.ModelProto:
    """Compose the FeatureSpec nodes with the model graph (features -> ctr, raw_score) into one raw graph.

    Args:
        model: the exported model: one input `features` float [batch, width]; outputs `ctr`, then optionally
            `raw_score` (ctr_contract.signatures.OUTPUT_NAMES), each float [batch, 1].
        spec: the FeatureSpec the model was trained with.
    Returns:
        the checked raw model: the 39 fields -> the model's outputs.
    """
    inputs = [v.name for v in model.graph.input]
    model_outputs = [v.name for v in model.graph.output]
    if model_outputs not in (list(OUTPUT_NAMES[:1]), list(OUTPUT_NAMES)):
        raise FeatureGraphError(
            f"the model graph outputs {model_outputs}; the raw graph needs {list(OUTPUT_NAMES)} "
            f"(or ['{OUTPUT_NAME}'] alone)"
        )
    if inputs != [INPUT_NAME]:
        raise FeatureGraphError(
            f"the model graph takes inputs {inputs}; the raw graph needs exactly ['{INPUT_NAME}']"
        )
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise FeatureGraphError(
            f"the raw graph needs ai.onnx opset >= {MIN_OPSET} (ReduceSum takes its axes as an input), the "
            f"model has {opset}; export with --opset {MIN_OPSET} or newer"
        )
    g = spec_nodes(spec)
    graph = helper.make_graph(
        g.nodes + list(model.graph.node),
        "ctr_raw",
        raw_inputs(),
        list(model.graph.output),
        initializer=g.inits + list(model.graph.initializer),
        value_info=list(model.graph.value_info),
    )
    opsets = [o for o in model.opset_import if o.domain != ML_DOMAIN] + [
        helper.make_opsetid(ML_DOMAIN, ML_OPSET)
    ]
    raw = helper.make_model(
        graph, opset_imports=opsets, producer_name="ctr-pipeline ctr_features.compiled.onnx_graph"
    )
    raw.ir_version = model.ir_version
    raw.functions.extend(model.functions)
    try:
        onnx.checker.check_model(raw, full_check=True)
    except onnx.checker.ValidationError as e:
        raise FeatureGraphError(f"the raw graph does not check: {e}") from e
    outputs = [v.name for v in raw.graph.output]
    if outputs != model_outputs:
        raise FeatureGraphError(f"the raw graph outputs {outputs}, expected {model_outputs}")
    return raw


def raw_ops(raw: onnx.ModelProto) -> list[str]:
    """Sorted `domain::op` names the raw graph uses (ai.onnx ops without a domain)."""
    return sorted({f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in raw.graph.node})
