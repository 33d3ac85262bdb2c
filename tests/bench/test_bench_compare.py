"""`python -m bench.compare A B`: the ratio per figure between two runs, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.compare import main
from bench.report.measurements import flatten
from tests.bench.bench_results import make_results


def _write_run(path: Path, speed: float) -> Path:
    path.mkdir()
    (path / "results.json").write_text(json.dumps(make_results(speed)))
    return path


def _line(out: str, figure: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.startswith(figure + " "))


def test_compare_prints_ratio_and_verdict_per_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write_run(tmp_path / "a", speed=1.0)
    b = _write_run(tmp_path / "b", speed=2.0)

    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out

    assert _line(out, "training/our Lightning pipeline/samples_per_sec")[-4:] == [
        "3.6e+04",
        "7.2e+04",
        "2.000",
        "better",
    ]
    assert _line(out, "inference/ONNX Runtime/batch=64/p99_ms")[-4:] == ["0.8", "0.4", "0.500", "better"]
    assert _line(out, "serving/ours (batching on)/c=64/qps")[-4:] == ["2.4e+04", "4.8e+04", "2.000", "better"]
    assert _line(out, "training/Keras model.fit/val_auc")[-4:] == ["0.75", "0.75", "1.000", "same"]
    figure_lines = [
        line for line in out.splitlines() if line.split()[-1:] in (["better"], ["worse"], ["same"])
    ]
    assert len(figure_lines) == len(flatten(make_results())) == 4 * 2 + 12 * 2 + 12 * 4 + 2


def test_compare_marks_slower_run_worse_and_lists_figures_of_one_run_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write_run(tmp_path / "a", speed=1.0)
    slower = make_results(0.5)
    slower["sections"]["serving"] = {"status": "failed", "reason": "kserve missing", "seconds": 1.0}
    (tmp_path / "b.json").write_text(json.dumps(slower))

    assert main([str(a), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out

    assert _line(out, "inference/PyTorch eager/batch=1/p50_ms")[-2:] == ["2.000", "worse"]
    assert _line(out, "training/bare PyTorch loop/samples_per_sec")[-2:] == ["0.500", "worse"]
    assert "only in A (50): serving/" in out


def test_compare_rejects_a_dir_without_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _write_run(tmp_path / "a", speed=1.0)

    assert main([str(a), str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert f"no bench results at {tmp_path / 'missing'}" in err


def test_compare_rejects_json_that_is_not_a_bench_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "other.json").write_text('{"rows": []}')

    assert main([str(tmp_path / "other.json"), str(tmp_path / "other.json")]) == 2
    assert "is not a bench results file (no 'sections' key)" in capsys.readouterr().err
