"""The raw-signature parity gate: the Python path, the ONNX raw graph and the SavedModel's `raw` signature
must agree within the tolerance on >= 10,000 raw Criteo rows.

The Python path is what training does: `FeatureSpec.transform` then the PyTorch model. Rows are the run's
validation rows (`val_raw.npz`) and generated groups that stress every branch of the transform: values from
the vocabularies and rate tables, unseen values, all-missing rows, negative and huge counts (Criteo has -1
and counts over 1e6; ±Inf and NaN are missing), empty and non-ASCII strings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_contract.signatures import OUTPUT_NAME, RAW_SIGNATURE
from ctr_features.spec import FeatureSpec
from export.errors import InputError, ParityError
from export.gates.parity import MIN_ROWS, ParityRows, compare

RawRows = tuple[np.ndarray, np.ndarray]  # numeric float64 (N, 13), NaN = missing; categorical str (N, 26)
RawPredictFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
EXTREME_COUNTS = np.array([-1.0, 0.0, 1.0, -2.0, 999_999.0, 1e6 + 1, 2**31, -(2**31), 1e12, -1e12, 2.0**53])
ODD_STRINGS = ["", "héllo", "日本語", "😀", "Ω" * 40, " ", "68FD1E64", "a" * 300, "\t", "C1:x"]


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
    if numeric.shape != (n, len(NUMERIC_FIELDS)) or categorical.shape != (n, len(CATEGORICAL_FIELDS)):
        raise InputError(
            f"raw validation rows {path} have shapes {list(numeric.shape)} and {list(categorical.shape)}; "
            f"expected [N, {len(NUMERIC_FIELDS)}] and [N, {len(CATEGORICAL_FIELDS)}]"
        )
    if categorical.dtype.kind != "U":
        raise InputError(
            f"raw validation rows {path}: categorical has dtype {categorical.dtype}, expected str"
        )
    return numeric, categorical.astype(object)


def _known(spec: FeatureSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 26) values drawn from each field's vocabulary and rate table (the lookups that hit)."""
    out = np.empty((n, len(CATEGORICAL_FIELDS)), dtype=object)
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
    x = np.floor(np.expm1(rng.uniform(0, np.log1p(1e7), (n, len(NUMERIC_FIELDS)))))
    x[rng.random(x.shape) < 0.05] = -1.0
    x[rng.random(x.shape) < missing] = np.nan
    return x


def build_raw_rows(
    spec: FeatureSpec, n_rows: int, validation: RawRows | None, seed: int = 0
) -> tuple[RawRows, dict[str, slice]]:
    """Validation rows first, then the stress groups, then mixed rows up to `n_rows` (>= MIN_ROWS)."""
    rng = np.random.default_rng(seed)
    n_num, n_cat = len(NUMERIC_FIELDS), len(CATEGORICAL_FIELDS)
    groups: list[tuple[str, np.ndarray, np.ndarray]] = []
    if validation is not None and len(validation[0]):
        groups.append(("validation", validation[0][:n_rows], validation[1][:n_rows]))
    k = 256
    groups.append(("vocabulary", _counts(rng, k, 0.1), _known(spec, rng, k)))
    # Unseen values shaped as Criteo's (8 hex digits: the server's native scan takes them) and not (longer).
    unseen = np.array([[f"unseen-{i}-{j}" for j in range(n_cat)] for i in range(k)], dtype=object)
    unseen[: k // 2] = _hex(rng, (k // 2, n_cat))
    groups.append(("unseen", _counts(rng, k, 0.1), unseen))
    groups.append(("all_missing", np.full((16, n_num), np.nan), np.full((16, n_cat), "", dtype=object)))
    extreme = rng.choice(
        np.concatenate([EXTREME_COUNTS, -EXTREME_COUNTS, [np.nan, np.inf, -np.inf]]), (k, n_num)
    )
    groups.append(("extreme_counts", extreme, _known(spec, rng, k)))
    odd = np.array(ODD_STRINGS, dtype=object)[rng.integers(0, len(ODD_STRINGS), (k, n_cat))]
    groups.append(("odd_strings", _counts(rng, k, 0.3), odd))
    used = sum(len(g[1]) for g in groups)
    fill = max(0, n_rows - used)
    if fill:
        # Each cell independently: a known value, an unseen one, or missing.
        # The first half's unseen values are shaped as Criteo's, the second half's are not.
        cats = _known(spec, rng, fill)
        pick = rng.random((fill, n_cat))
        shaped = np.arange(fill)[:, None] < fill // 2
        cats[(pick < 0.2) & shaped] = _hex(rng, (fill, n_cat))[(pick < 0.2) & shaped]
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


def python_predictor(
    spec: FeatureSpec, features_predictor: Callable[[np.ndarray], np.ndarray]
) -> RawPredictFn:
    """FeatureSpec.transform followed by the (PyTorch) features predictor."""
    return lambda numeric, categorical: features_predictor(spec.transform(numeric, categorical))


# The request sizes the served raw path is checked at: a single row (the native few-row transform, or the
# Python one-row path when the native scan declines the body), a few rows, the largest few-row batch, the
# smallest numpy one, and ranking requests.
SERVED_SIZES = (1, 3, 16, 17, 100, 256)


def serving_predictor(
    spec: FeatureSpec, features_predictor: Callable[[np.ndarray], np.ndarray]
) -> RawPredictFn:
    """Our server's raw path as REST clients reach it, then the features model (`model.onnx` in ONNX Runtime).

    The rows go in requests of SERVED_SIZES rows in turn, each a JSON body in the forms clients send, in row
    format (`client_rows`) and, every other round of sizes, columnar (`client_columns`), decoded by the server's own REST decoder (the native scan, msgspec or the exact path,
    whichever takes it), then through the compiled FeatureSpec (ctr_features/compiled/table.py: native few-row,
    Python one-row or numpy). Twice: the first pass fills the one-row z-score cache, the second runs from it,
    and the two must agree bit for bit. A request whose counts JSON cannot carry (infinite or not integral)
    goes as the gRPC decoder makes it (`RawBatch.from_rows`)."""
    import orjson

    from ctr_features.compiled.table import RawTransform
    from serving.codecs.raw_body import client_columns, client_rows, json_can_carry
    from serving.codecs.rest_codec import decode_predict
    from serving.requests import RawBatch
    from serving.signatures import Signature

    transform = RawTransform(spec.to_dict())
    signature = Signature("features", OUTPUT_NAME, spec.width, 1, has_raw=True)

    def request(numeric: np.ndarray, categorical: np.ndarray, columnar: bool) -> RawBatch:
        if not json_can_carry(numeric):
            return RawBatch.from_rows(numeric, categorical)
        if columnar:
            body = orjson.dumps({"inputs": client_columns(numeric, categorical)})
        else:
            body = orjson.dumps({"instances": client_rows(numeric, categorical)})
        batch = decode_predict(body, signature)[1].batch
        assert isinstance(batch, RawBatch)
        return batch

    def predict(numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        batches, start, k = [], 0, 0
        while start < len(numeric):
            end = start + SERVED_SIZES[k % len(SERVED_SIZES)]
            # every size in row format, then columnar (SERVED_SIZES has an even count of sizes)
            columnar = k // len(SERVED_SIZES) % 2 == 1
            batches.append(request(numeric[start:end], categorical[start:end], columnar))
            start, k = end, k + 1
        first = [transform(b) for b in batches]
        second = [transform(b) for b in batches]
        for i, (a, b) in enumerate(zip(first, second, strict=True)):
            if not np.array_equal(a, b):
                raise ParityError(f"the served raw transform gave request {i} other features the second time")
        return features_predictor(np.concatenate(second))

    return predict


def onnxruntime_raw_predictor(path: Path, threads: int | None = None) -> RawPredictFn:
    """`model_raw.onnx` in an ONNX Runtime CPU session."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda numeric, categorical: session.run([OUTPUT_NAME], raw_feed(numeric, categorical))[0]


def savedmodel_raw_predictor(directory: Path) -> RawPredictFn:
    """The SavedModel reloaded with `tf.saved_model.load`, called through its `raw` signature."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(directory))
    signature = loaded.signatures[RAW_SIGNATURE]

    def predict(numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        feed = raw_feed(numeric, categorical)
        tensors = {k: tf.constant(v.tolist() if v.dtype == object else v) for k, v in feed.items()}
        return signature(**tensors)[OUTPUT_NAME].numpy()

    predict.loaded = loaded  # type: ignore[attr-defined]  # keep the restored tables alive
    return predict


def run_raw_gate(
    spec: FeatureSpec,
    rows: RawRows,
    groups: dict[str, slice],
    backends: dict[str, RawPredictFn],
    tolerance: float,
) -> dict[str, Any]:
    """Run every raw backend on the rows; raise ParityError if they disagree.

    Returns:
        the report from `export.gates.parity.compare`, over the rows' transformed features.
    """
    if len(rows[0]) < MIN_ROWS:
        raise ParityError(f"raw parity needs >= {MIN_ROWS} rows, got {len(rows[0])}")
    outputs = {name: np.asarray(fn(*rows)).reshape(-1, 1) for name, fn in backends.items()}
    report = compare(
        ParityRows(spec.transform(*rows), groups), outputs, tolerance, reference=next(iter(backends))
    )
    if not report["passed"]:
        raise ParityError(
            f"raw-signature parity failed: max abs difference {report['max_abs_diff']:.3g} > tolerance "
            f"{tolerance:.3g} (by pair: {report['max_abs_diff_by_pair']}, by group: "
            f"{report['max_abs_diff_by_group']}, non-finite outputs: {report['non_finite_outputs']}); "
            "nothing was published"
        )
    return report
