"""bench.raw_stages: the per-stage timings run on a real version and a Criteo CSV as clients send it."""

from __future__ import annotations

import math
from pathlib import Path

from bench.raw_stages import criteo_rows, stages
from tests.serving.raw_model_repo import fit_spec, write_raw_version

STAGES = [
    "body -> request (the server's)",
    "orjson parse",
    "decode+validate after orjson",
    "transform+model",
    "body -> scores",
    "drift",
    "encode",
    "vec body -> request",
    "vec parse",
    "vec decode+validate",
    "vec model",
]


def test_criteo_csv_rows_become_client_rows_with_empty_cells_absent(tmp_path: Path) -> None:
    header = (
        "label," + ",".join(f"I{i}" for i in range(1, 14)) + "," + ",".join(f"C{i}" for i in range(1, 27))
    )
    cells = ["0", "", "260.0", "-1"] + [""] * 10 + ["68fd1e64", ""] + ["a73ee510"] * 24
    (tmp_path / "rows.csv").write_text(f"{header}\n{','.join(cells)}\n")
    (row,) = criteo_rows(tmp_path / "rows.csv")
    assert row == {"I2": 260, "I3": -1, "C1": "68fd1e64"} | {f"C{i}": "a73ee510" for i in range(3, 27)}
    assert len(criteo_rows(None)) == 256


def test_every_stage_is_timed_per_row_at_one_and_many_rows(tmp_path: Path) -> None:
    version = write_raw_version(tmp_path / "ctr", 1, fit_spec())
    for n in (1, 17):
        timings = stages(version, criteo_rows(None), n, repeat=1)
        assert list(timings) == STAGES
        assert all(math.isfinite(t) and t > 0 for t in timings.values()), timings
