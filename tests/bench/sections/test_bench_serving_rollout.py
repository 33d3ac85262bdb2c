"""bench.sections.serving_rollout: its model config files mean what the server reads, and a short real run
reports the split's shares and the shadow jobs beside the paired figures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.harness import procs
from bench.sections import serving_rollout
from ctr_contract.traffic import parse_traffic
from serving.repository.model_config import parse_model_config
from tests.serving.model_repo import make_weights, write_version


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("repo") / "ctr"
    write_version(base, 1, make_weights(seed=1))
    return base


def test_each_servers_config_gives_its_labels_policy_and_shares(base: Path, tmp_path: Path) -> None:
    two = serving_rollout.two_versions(base, tmp_path / "repo")
    assert sorted(p.name for p in two.iterdir()) == ["1", "2"]
    assert (two / "2" / "model.onnx").read_bytes() == (base / "1" / "model.onnx").read_bytes()
    for name, (label, canary, shadow) in serving_rollout.SETUPS.items():
        text = serving_rollout.model_config(two, label, canary, shadow)
        (spec,) = parse_model_config(text)
        assert (spec.name, spec.base_path, spec.labels) == ("ctr", two, {"stable": 1, label: 2}), name
        assert (spec.policy.kind, spec.policy.versions) == ("specific", (1, 2))
        split = parse_traffic(text)["ctr"]
        assert (split.canary_percent, split.shadow_percent) == (canary, shadow)


def test_report_lines_show_medians_and_paired_ratios() -> None:
    row = {"server": "canary 10%", "connections": 64, "qps": 12000.4, "p99_ms": 7.25, "cpu_us": 61.04}
    base_row = {**row, "server": "canary 0%", "qps": 12500.0}
    figure = {"median": -0.04, "min": -0.08, "max": 0.01, "rounds": [-0.04]}
    result = {
        "rows": [base_row, row],
        "paired": {"64": {"canary 10%": dict.fromkeys(("qps", "p99_ms", "cpu_us"), figure)}},
    }
    lines = serving_rollout.rollout_lines(result)
    assert lines[-2] == "| canary 0% | 64 | 12,500 | 7.25 | 61.0 |  |  |  |"
    assert lines[-1] == (
        "| canary 10% | 64 | 12,000 | 7.25 | 61.0 | -4.0% (-8.0% to +1.0%) | -4.0% (-8.0% to +1.0%) | "
        "-4.0% (-8.0% to +1.0%) |"
    )
    assert serving_rollout.rollout_lines({}) == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (run `make sysdeps`)")
def test_a_short_run_measures_every_server_and_their_shares(base: Path, tmp_path: Path) -> None:
    commands: list[str] = []
    try:
        result = serving_rollout.run(1, 1, base, tmp_path, commands)
    finally:
        procs.stop_all()
    points = {(r["server"], r["connections"]) for r in result["rows"]}
    assert points == {(n, c) for c, names in serving_rollout.PLAN for n in names}
    assert all(r["errors"] == 0 for r in result["rows"])
    served = result["served"]
    assert served["canary 0%"]["answered"].get("2", 0) <= 1  # at most the readiness probe, before 1 loaded
    assert 0.04 < served["canary 10%"]["share_version_2"] < 0.16
    # Shadow scoring answers nothing from version 2: at most the readiness probe, as above
    assert served["shadow 10%"]["shadow_scored"] > 0 and served["shadow 10%"]["answered"].get("2", 0) <= 1
    assert set(result["paired"]["8"]) == {"shadow 10%"}
    assert result["shadow_p99_ratio_at_8"] == result["paired"]["8"]["shadow 10%"]["p99_ms"]["median"]


def test_in_process_cost_measures_every_setup_against_canary_0(base: Path, tmp_path: Path) -> None:
    two = serving_rollout.two_versions(base, tmp_path / "repo")
    result = serving_rollout.in_process_cost(two, reps=2, predicts=200)
    assert set(result["cpu_us"]) == set(serving_rollout.SETUPS)
    assert set(result["vs_canary_0_us"]) == set(serving_rollout.SETUPS) - {serving_rollout.CANARY_0}
    for figure in result["cpu_us"].values():
        assert 0 < figure["min"] <= figure["median"] <= figure["max"] < 10_000
    lines = serving_rollout.in_process_lines({"in_process": result})
    assert len(lines) == 2 + len(serving_rollout.SETUPS) and lines[2].startswith("- canary 0%: ")
