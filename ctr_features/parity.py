"""The one parity harness: every compiled form of the FeatureSpec against the reference `FeatureSpec.transform`.

A form is a function of raw rows (numeric float64 (N, 13), NaN or ±Inf = missing; categorical str (N, 26),
"" = missing) to the float32 (N, width) features; each compiled form must give the reference's features:

  records        training's encoder (`ctr_features.compiled.records.encode`), then `expand` (pyarrow, torch)
  arrow_records  the same records by Arrow hash lookups (`encode_records`), then `expand`
  onnx_graph     the FeatureSpec nodes of `model_raw.onnx` (`onnx_graph.features_model`) in ONNX Runtime
  tf_graph       the FeatureSpec part of the SavedModel's `raw` signature (`tf_graph.RawFeatures`)
  table          serving's compiled table (`ctr_features.compiled.table.RawTransform`, its native few-row
                 code included) on RawBatches of SERVED_SIZES rows, in the forms the server's decoders make

`compiled_forms` builds those whose libraries are installed. The rows are the gate's kinds (`build_raw_rows`):
validation rows, values from the vocabularies and rate tables, unseen values (Criteo-shaped and not),
all-missing rows, extreme counts (Criteo has -1 and counts over 1e6; ±Inf and NaN are missing), empty, long
and non-ASCII strings, and a random mix. Export's raw parity gate (export/gates/raw_parity.py) runs the
harness on its rows; tests/ctr_features/ runs every form on a small fitted spec.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.errors import FeatureParityError
from ctr_features.layout import N_CAT, N_NUM
from ctr_features.spec import FeatureSpec

RawRows = tuple[np.ndarray, np.ndarray]  # numeric float64 (N, 13), NaN = missing; categorical str (N, 26)
Form = Callable[[np.ndarray, np.ndarray], np.ndarray]  # raw rows -> float32 (N, width) features
EXTREME_COUNTS = np.array([-1.0, 0.0, 1.0, -2.0, 999_999.0, 1e6 + 1, 2**31, -(2**31), 1e12, -1e12, 2.0**53])
ODD_STRINGS = ["", "héllo", "日本語", "😀", "Ω" * 40, " ", "68FD1E64", "a" * 300, "\t", "C1:x"]
# The request sizes the served table is checked at: a single row (the native few-row transform, or the
# Python one-row path for values it does not key), a few rows, the largest few-row batch, the smallest numpy
# one, and ranking requests.
SERVED_SIZES = (1, 3, 16, 17, 100, 256)
# Each form and what it needs installed.
FORMS: dict[str, tuple[str, ...]] = {
    "records": ("pyarrow", "torch"),
    "arrow_records": ("pyarrow", "torch"),
    "onnx_graph": ("onnx", "onnxruntime"),
    "tf_graph": ("tensorflow",),
    "table": (),
}


def _known(spec: FeatureSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 26) values drawn from each field's vocabulary and rate table (the lookups that hit)."""
    out = np.empty((n, N_CAT), dtype=object)
    for j, t in enumerate(spec.tables):
        pool = [v.decode("utf-8") for v in np.concatenate([t.vocab, t.rate_values])] or [""]
        out[:, j] = [pool[i] for i in rng.integers(0, len(pool), n)]
    return out


def _hex(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Values shaped as Criteo's hashed categoricals, 8 hex digits, drawn at random (unseen, bar chance)."""
    values = [f"{v:08x}" for v in rng.integers(0, 2**32, shape[0] * shape[1]).tolist()]
    return np.array(values, dtype=object).reshape(shape)


def _counts(rng: np.random.Generator, n: int, missing: float) -> np.ndarray:
    """(n, 13) log-uniform counts up to 1e7 with random signs near zero, and `missing` NaN share."""
    x = np.floor(np.expm1(rng.uniform(0, np.log1p(1e7), (n, N_NUM))))
    x[rng.random(x.shape) < 0.05] = -1.0
    x[rng.random(x.shape) < missing] = np.nan
    return x


def build_raw_rows(
    spec: FeatureSpec, n_rows: int, validation: RawRows | None, seed: int = 0
) -> tuple[RawRows, dict[str, slice]]:
    """Validation rows first, then the stress groups, then mixed rows up to `n_rows`; and each group's rows."""
    rng = np.random.default_rng(seed)
    groups: list[tuple[str, np.ndarray, np.ndarray]] = []
    if validation is not None and len(validation[0]):
        groups.append(("validation", validation[0][:n_rows], validation[1][:n_rows]))
    k = 256
    groups.append(("vocabulary", _counts(rng, k, 0.1), _known(spec, rng, k)))
    # Unseen values shaped as Criteo's (8 hex digits: the server's native scan takes them) and not (longer).
    unseen = np.array([[f"unseen-{i}-{j}" for j in range(N_CAT)] for i in range(k)], dtype=object)
    unseen[: k // 2] = _hex(rng, (k // 2, N_CAT))
    groups.append(("unseen", _counts(rng, k, 0.1), unseen))
    groups.append(("all_missing", np.full((16, N_NUM), np.nan), np.full((16, N_CAT), "", dtype=object)))
    extreme = rng.choice(
        np.concatenate([EXTREME_COUNTS, -EXTREME_COUNTS, [np.nan, np.inf, -np.inf]]), (k, N_NUM)
    )
    groups.append(("extreme_counts", extreme, _known(spec, rng, k)))
    odd = np.array(ODD_STRINGS, dtype=object)[rng.integers(0, len(ODD_STRINGS), (k, N_CAT))]
    groups.append(("odd_strings", _counts(rng, k, 0.3), odd))
    used = sum(len(g[1]) for g in groups)
    fill = max(0, n_rows - used)
    if fill:
        # Each cell independently: a known value, an unseen one, or missing.
        # The first half's unseen values are shaped as Criteo's, the second half's are not.
        cats = _known(spec, rng, fill)
        pick = rng.random((fill, N_CAT))
        shaped = np.arange(fill)[:, None] < fill // 2
        cats[(pick < 0.2) & shaped] = _hex(rng, (fill, N_CAT))[(pick < 0.2) & shaped]
        cats[(pick < 0.2) & ~shaped] = "never-seen"
        cats[pick > 0.9] = ""
        groups.append(("random", _counts(rng, fill, 0.2), cats))
    slices, start = {}, 0
    for name, num, _ in groups:
        slices[name] = slice(start, start + len(num))
        start += len(num)
    numeric = np.concatenate([g[1] for g in groups]).astype(np.float64)
    categorical = np.concatenate([np.asarray(g[2], dtype=object) for g in groups])
    return (numeric, categorical), slices


def raw_feed(numeric: np.ndarray, categorical: np.ndarray) -> dict[str, np.ndarray]:
    """The raw signature's inputs: I* float64 (N,), C* object str (N,)."""
    feed = {f: np.ascontiguousarray(numeric[:, i], dtype=np.float64) for i, f in enumerate(NUMERIC_FIELDS)}
    feed.update({f: np.asarray(categorical[:, j], dtype=object) for j, f in enumerate(CATEGORICAL_FIELDS)})
    return feed


def _strings(categorical: np.ndarray) -> np.ndarray:
    """The values as str, missing (None) as "", the way every decoder hands them on."""
    return np.array(
        [["" if v is None else str(v) for v in row] for row in categorical.tolist()], dtype=object
    )


def _records_form(spec: FeatureSpec, arrow_lookups: bool) -> Form:
    import pyarrow as pa

    from ctr_features.compiled.records import encode, encode_records, expand, lookups

    fields = lookups(spec) if arrow_lookups else None

    def form(numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        columns: dict[str, Any] = {LABEL: pa.array(np.zeros(len(numeric), np.int8))}
        columns.update({f: pa.array(numeric[:, i], pa.float64()) for i, f in enumerate(NUMERIC_FIELDS)})
        values = categorical.tolist()
        columns.update(
            {f: pa.array([r[j] for r in values], pa.string()) for j, f in enumerate(CATEGORICAL_FIELDS)}
        )
        table, index = pa.table(columns), np.arange(len(numeric), dtype=np.int64)
        rec = encode_records(spec, fields, table, index) if fields is not None else encode(spec, table, index)
        return expand(rec, spec.width)[0].numpy()

    return form


def _onnx_form(spec: FeatureSpec) -> Form:
    import onnxruntime as ort

    from ctr_contract.signatures import INPUT_NAME
    from ctr_features.compiled.onnx_graph import features_model

    model = features_model(spec).SerializeToString()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return lambda numeric, categorical: session.run([INPUT_NAME], raw_feed(numeric, _strings(categorical)))[0]


def _tf_form(spec: FeatureSpec) -> Form:
    import tensorflow as tf

    from ctr_features.compiled.tf_graph import RawFeatures, raw_specs

    features = RawFeatures(spec)
    run = tf.function(features.__call__, input_signature=raw_specs())

    def form(numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        feed = raw_feed(numeric, _strings(categorical))
        return run(*(tf.constant(v.tolist() if v.dtype == object else v) for v in feed.values())).numpy()

    return form


def table_form(spec: FeatureSpec, sizes: Iterable[int] = SERVED_SIZES) -> Form:
    """Serving's compiled table on the rows in requests of `sizes` rows in turn, each a RawBatch in one of the
    decoders' forms (arrays as gRPC's, a field-major list as the exact path's, the values' keys as the native
    scan's). Twice: the first pass fills the one-row z-score cache, the second runs from it, and the two must
    agree bit for bit (FeatureParityError)."""
    from ctr_features.compiled.raw_batch import RawBatch
    from ctr_features.compiled.table import RawTransform
    from ctr_features.compiled.value_table import RawKeys

    transform = RawTransform(spec.to_dict())
    cycle = tuple(sizes)

    def batch(numeric: np.ndarray, categorical: np.ndarray, kind: int) -> RawBatch:
        if kind == 0:
            return RawBatch.from_rows(numeric, categorical)
        counts = np.ascontiguousarray(numeric.T)
        strings = categorical.T.ravel().tolist()  # field-major
        keys = RawKeys.of_list(strings, (N_CAT, len(numeric))) if kind == 2 else None
        if keys is not None and keys.slow is None:
            return RawBatch.of_keys(counts, keys)
        return RawBatch.of_strings(counts, strings, keys, kind == 2)

    def form(numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        categorical = _strings(categorical)
        requests, start, k = [], 0, 0
        while start < len(numeric):
            end = start + cycle[k % len(cycle)]
            kind = k // len(cycle) % 3  # every size in each form in turn
            requests.append((numeric[start:end], categorical[start:end], kind))
            start, k = end, k + 1
        first = [transform(batch(*r)) for r in requests]
        second = [transform(batch(*r)) for r in requests]
        for i, (a, b) in enumerate(zip(first, second, strict=True)):
            if not np.array_equal(a, b):
                raise FeatureParityError(
                    f"the served raw transform gave request {i} other features the second time"
                )
        return np.concatenate(second) if second else np.zeros((0, spec.width), np.float32)

    return form


def installed(name: str) -> bool:
    """Whether every library form `name` needs is installed."""
    return all(importlib.util.find_spec(lib) is not None for lib in FORMS[name])


def compiled_forms(spec: FeatureSpec, names: Iterable[str] = FORMS) -> dict[str, Form]:
    """The forms of `names` whose libraries are installed, built for `spec`."""
    builders: dict[str, Callable[[], Form]] = {
        "records": lambda: _records_form(spec, False),
        "arrow_records": lambda: _records_form(spec, True),
        "onnx_graph": lambda: _onnx_form(spec),
        "tf_graph": lambda: _tf_form(spec),
        "table": lambda: table_form(spec),
    }
    return {name: builders[name]() for name in names if installed(name)}


def check_forms(
    spec: FeatureSpec,
    rows: RawRows,
    groups: dict[str, slice],
    forms: dict[str, Form],
    tolerance: float,
) -> dict[str, Any]:
    """Run every form on the rows; raise FeatureParityError if one's features differ from the reference's.

    Returns:
        rows, tolerance and, per form, the max abs difference overall and by group.
    """
    reference = spec.transform(*rows)
    report: dict[str, Any] = {"rows": len(reference), "tolerance": tolerance, "forms": {}}
    for name, form in forms.items():
        got = np.asarray(form(*rows))
        if got.shape != reference.shape or got.dtype != np.float32:
            raise FeatureParityError(
                f"feature parity failed: form {name} gave {got.dtype} {list(got.shape)}, expected float32 "
                f"{list(reference.shape)}"
            )
        diff = np.abs(got.astype(np.float64) - reference)
        diff[~np.isfinite(got)] = np.inf
        by_group = {g: float(diff[s].max(initial=0.0)) for g, s in groups.items()}
        worst = float(diff.max(initial=0.0))
        report["forms"][name] = {"max_abs_diff": worst, "max_abs_diff_by_group": by_group}
        if not worst <= tolerance:
            raise FeatureParityError(
                f"feature parity failed: form {name} differs from FeatureSpec.transform by {worst:.3g} > "
                f"tolerance {tolerance:.3g} (by group: {by_group})"
            )
    return report
