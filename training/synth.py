"""Synthetic Criteo-format data with a known click model: `python -m training.synth --out FILE --rows N --seed S`.

Writes FILE (Kaggle train.txt form: tab-separated, no header), FILE.oracle.npy (float32 [N] true click
probability per row) and FILE.oracle.json (oracle AUC/logloss on the validation split training uses).
Rows are generated in fixed-size chunks, each from its own seeded stream, so output depends only on the seed
and the day.

`--day D` writes day D of a drifting world (training/truth.py says what drifts and how fast); D may be a
fraction (2.25 is 06:00 on day 2) and the drift is continuous in D. `--drift-scale K` makes the world drift K
times as fast (day D under K is day K*D under 1). Day 0, the default, is today's world, byte for byte. Without
`--out`, day D goes to artifacts/data/dayD.txt.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.data.split import DEFAULT_VAL_FRACTION, fmix32, validation_mask
from ctr_model.metrics import log_loss, roc_auc
from training.truth import (
    CATEGORICAL_SHAPE,
    NUMERIC_SHAPE,
    WORLD_SEED,
    GroundTruth,
    effective_day,
    numeric_shift,
    value_ids,
)

CHUNK_ROWS = 1 << 20
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_CDFS = [np.cumsum(1.0 / np.arange(1, v + 1) ** a) for v, a, _ in CATEGORICAL_SHAPE]


def sample_rows(rng: np.random.Generator, n: int, day: float = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draw raw rows of `day`: counts float64 [n, 13] (NaN = missing) and categorical value ids int64 [n, 26].

    A value id is the value's Zipf rank on day 0 (-1 = missing); on later days the drifting fields have new
    values on top of their ranking (`training.truth.value_ids`). `day` is the scale-1 (effective) day.
    """
    activity = rng.normal(size=(n, 1))  # a shared "how active is this user" factor correlates the counts
    med = np.array([m for m, _, _ in NUMERIC_SHAPE]) + numeric_shift(day)
    spread = np.array([s for _, s, _ in NUMERIC_SHAPE])
    latent = med + spread * (0.5 * activity + np.sqrt(0.75) * rng.normal(size=(n, 13)))
    counts = np.floor(np.expm1(np.maximum(latent, 0.0)) * rng.random((n, 13)) ** 0.3)
    counts[:, 1] -= 1.0  # I2 takes -1 like the real data
    counts[rng.random((n, 13)) < np.array([r for _, _, r in NUMERIC_SHAPE])] = np.nan
    ranks = np.empty((n, len(CATEGORICAL_SHAPE)), dtype=np.int64)
    for j, (cdf, (_, _, missing_rate)) in enumerate(zip(_CDFS, CATEGORICAL_SHAPE, strict=True)):
        ranks[:, j] = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        ranks[rng.random(n) < missing_rate, j] = -1
    return counts, value_ids(ranks, day)


def make_world(day: float = 0, calibration_rows: int = 200_000) -> GroundTruth:
    """The ground truth of (effective) `day`, its bias calibrated on a fixed sample of that day to a ~25% click rate."""
    truth = GroundTruth(day)
    truth.calibrate(*sample_rows(np.random.default_rng(WORLD_SEED + 1), calibration_rows, day))
    return truth


def day_key(day: float) -> list[int]:
    """The part of a row stream's seed that names the (effective) day: nothing for day 0, as before days existed."""
    if float(day).is_integer():
        return [int(day)] if day else []
    return [round(day * 1_000_000), 1]  # the trailing 1 keeps fractions apart from whole days


def hex_values(field_index: int, ranks: np.ndarray) -> pa.Array:
    """Zipf ranks -> 8-hex-digit strings like Criteo's hashed values; rank -1 -> null (empty cell)."""
    h = fmix32(fmix32(ranks.astype(np.uint32)) ^ np.uint32(field_index * 0x9E3779B9 & 0xFFFFFFFF))
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    chars = _HEX[(h[:, None] >> shifts) & np.uint32(0xF)]  # (n, 8) ascii bytes
    offsets = np.arange(0, 8 * ranks.size + 1, 8, dtype=np.int32)
    valid = ranks >= 0
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.string(),
        ranks.size,
        [bitmap, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())],
        null_count=int((~valid).sum()),
    )


def generate(
    out: Path,
    rows: int,
    seed: int,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    day: float = 0,
    drift_scale: float = 1.0,
) -> dict[str, float | int]:
    """Write `rows` rows of world day `day` (under `drift_scale`) to `out` plus the oracle files; returns the summary."""
    if rows < 100:
        raise ValueError(f"--rows must be at least 100 to score the oracle, got {rows}")
    if day < 0:
        raise ValueError(f"--day must be >= 0, got {day}")
    if drift_scale < 0:
        raise ValueError(f"--drift-scale must be >= 0, got {drift_scale}")
    eff = effective_day(day, drift_scale)
    truth = make_world(eff)
    out.parent.mkdir(parents=True, exist_ok=True)
    probs = np.empty(rows, dtype=np.float32)
    labels = np.empty(rows, dtype=np.int8)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as sink:
            for start in range(0, rows, CHUNK_ROWS):
                n = min(CHUNK_ROWS, rows - start)
                # Day 0 keeps the stream it always had; every other day gets streams of its own.
                rng = np.random.default_rng([seed, start // CHUNK_ROWS, *day_key(eff)])
                counts, ranks = sample_rows(rng, n, eff)
                p = 1.0 / (1.0 + np.exp(-truth.logit(counts, ranks)))
                y = (rng.random(n) < p).astype(np.int8)
                probs[start : start + n], labels[start : start + n] = p, y
                arrays = [pa.array(y)]
                arrays += [
                    pa.array(counts[:, j], mask=np.isnan(counts[:, j])).cast(pa.int64()) for j in range(13)
                ]
                arrays += [hex_values(j, ranks[:, j]) for j in range(len(CATEGORICAL_SHAPE))]
                table = pa.Table.from_arrays(arrays, names=[LABEL, *NUMERIC_FIELDS, *CATEGORICAL_FIELDS])
                opts = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
                pacsv.write_csv(table, sink, write_options=opts)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)  # an interrupted run leaves no half-written file behind
    val = validation_mask(np.arange(rows), val_fraction)
    summary: dict[str, float | int] = {
        "rows": rows,
        "seed": seed,
        "day": int(day) if float(day).is_integer() else day,
        **({"drift_scale": drift_scale} if drift_scale != 1 else {}),
        "val_fraction": val_fraction,
        "val_rows": int(val.sum()),
        "positive_rate": float(labels.mean()),
        "oracle_auc": roc_auc(labels[val], probs[val]),
        "oracle_logloss": log_loss(labels[val], probs[val]),
    }
    np.save(oracle_paths(out)[0], probs)
    oracle_paths(out)[1].write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def oracle_paths(data: Path) -> tuple[Path, Path]:
    """Where the generator leaves the per-row true probabilities and the oracle summary for `data`."""
    return data.with_name(data.name + ".oracle.npy"), data.with_name(data.name + ".oracle.json")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.synth", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, help="output file, Kaggle train.txt form (default: artifacts/data/dayN.txt)"
    )
    parser.add_argument(
        "--day",
        type=float,
        default=0,
        help="day of the drifting world, a fraction allowed (2.25 = 06:00 on day 2); 0 (default) is today's",
    )
    parser.add_argument(
        "--drift-scale", type=float, default=1.0, help="drift speed multiplier (default 1, today's world)"
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="number of rows (default 1000000)")
    parser.add_argument("--seed", type=int, default=7, help="sampling seed; the click model itself is fixed")
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULT_VAL_FRACTION,
        help="validation share scored by the oracle",
    )
    args = parser.parse_args(argv)
    if args.day < 0:
        parser.error(f"--day must be >= 0, got {args.day:g}")
    if args.drift_scale < 0:
        parser.error(f"--drift-scale must be >= 0, got {args.drift_scale:g}")
    out = args.out or Path(f"artifacts/data/day{args.day:g}.txt")
    t0 = time.perf_counter()
    s = generate(out, args.rows, args.seed, args.val_fraction, args.day, args.drift_scale)
    print(
        f"wrote {s['rows']} rows of day {args.day:g} to {out} in {time.perf_counter() - t0:.1f}s: positive rate {s['positive_rate']:.3f}, "
        f"oracle val AUC {s['oracle_auc']:.4f} logloss {s['oracle_logloss']:.4f}"
    )


if __name__ == "__main__":
    main()
