"""bench.sections.serving_load drives a real server with wrk and parses its numbers."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench.harness import procs
from bench.report.markdown import raw_ranking_lines
from bench.sections import serving_load
from tests.serving.codecs.test_unit_raw_fast import fit_spec
from tests.serving.model_repo import make_weights, write_raw_version, write_version

pytestmark = pytest.mark.skipif(
    shutil.which("wrk") is None, reason="wrk is not installed (run `make sysdeps`)"
)


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`<repo>/ctr/1/` with a small ONNX MLP (tests/serving/model_repo.py), the server's default backend."""
    base = tmp_path_factory.mktemp("repo") / "ctr"
    write_version(base, 1, make_weights(seed=1))
    return base


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_measure_reports_qps_and_percentiles_for_our_server(model_repo: Path, tmp_path: Path) -> None:
    port = serving_load.free_port()
    cmd = [
        sys.executable,
        "-m",
        "serving",
        "--host=127.0.0.1",
        f"--port={serving_load.free_port()}",
        f"--rest_api_port={port}",
        "--model_name=ctr",
        f"--model_base_path={model_repo}",
    ]
    script = serving_load.write_lua(tmp_path / "single.lua", 1)
    commands: list[str] = []
    server = serving_load.Server("ours", cmd, port)
    try:
        server.start(tmp_path, commands)
        rows = list(serving_load.measure([server], [(1, script), (8, script)], 2, 1, commands).values())
    finally:
        procs.stop_all()
    assert [(r["server"], r["connections"], r["errors"]) for r in rows] == [
        ("ours", 1, 0.0),
        ("ours", 8, 0.0),
    ]
    for row in rows:
        assert len(row["qps_runs"]) == 2
        assert row["qps"] == sorted(row["qps_runs"])[1]
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
    assert commands[0] == " ".join(cmd)
    assert commands[1].startswith("wrk -t1 -c1 -d1s --latency -s ")
    assert len(commands) == 3  # the server, then each distinct wrk command once


def test_base_path_of_accepts_the_repository_or_the_base_path(model_repo: Path) -> None:
    assert serving_load.base_path_of(model_repo) == model_repo
    assert serving_load.base_path_of(model_repo.parent) == model_repo
    assert serving_load.latest_version_dir(model_repo) == model_repo / "1"


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_tiny_mode_ranking_measures_raw_rows_beside_vectors_and_reports_rows_per_sec(tmp_path: Path) -> None:
    base = tmp_path / "repo" / "ctr"
    write_raw_version(base, 1, make_weights(seed=1), fit_spec())
    port = serving_load.free_port()
    cmd = [
        sys.executable,
        "-m",
        "serving",
        "--host=127.0.0.1",
        f"--port={serving_load.free_port()}",
        f"--rest_api_port={port}",
        "--model_name=ctr",
        f"--model_base_path={base}",
        "--intra_op_threads=1",
    ]
    n = serving_load.RANKING_INSTANCES
    vector = serving_load.write_lua(tmp_path / "ranking.lua", n)
    raw = serving_load.write_raw_lua(tmp_path / "raw_ranking.lua", n)
    commands: list[str] = []
    server = serving_load.Server(serving_load.OURS_OFF, cmd, port)
    rounds, seconds = serving_load.ROUNDS_SECONDS["tiny"]
    try:
        server.start(tmp_path, commands)
        section = serving_load.measure_ranking([server], vector, raw, rounds, seconds, commands)
    finally:
        procs.stop_all()
    (row,) = section["raw_ranking_rows"]
    assert (row["server"], row["connections"], row["signature"], row["errors"]) == (
        serving_load.OURS_OFF,
        8,
        "raw",
        0.0,
    )
    assert (
        row["qps"] > 0 and row["rows_per_sec"] == row["qps"] * n == section["raw_instances_per_sec_unbatched"]
    )
    assert section["instances_per_sec_unbatched"] == section["ranking_rows"][0]["qps"] * n
    lines = raw_ranking_lines(section)
    assert (
        lines[0]
        == "Ranking requests of 100 rows, raw Criteo rows vs 128-float vectors (goal: raw >= 150k rows/s):"
    )
    assert lines[-1].startswith(f"| {serving_load.OURS_OFF} | 8 | ")
