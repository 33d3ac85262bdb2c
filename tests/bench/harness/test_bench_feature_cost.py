"""bench/harness/feature_cost.py: each setup paired round by round against all features off."""

from __future__ import annotations

from bench.harness.feature_cost import ALL_OFF, ALL_ON, table


def test_table_pairs_every_setup_with_all_off_round_by_round() -> None:
    runs = {
        ALL_OFF: [
            {"qps": 100.0, "p99_ms": 1.0, "cpu_us": 50.0},
            {"qps": 200.0, "p99_ms": 1.0, "cpu_us": 40.0},
            {"qps": 150.0, "p99_ms": 1.0, "cpu_us": 45.0},
        ],
        ALL_ON: [
            {"qps": 95.0, "p99_ms": 1.0, "cpu_us": 55.0},
            {"qps": 180.0, "p99_ms": 1.0, "cpu_us": 44.0},
            {"qps": 150.0, "p99_ms": 1.0, "cpu_us": 45.0},
        ],
    }
    assert table(runs).splitlines()[2:] == [
        "| all off | 150 | 45.0 | +0.0% (+0.0%, +0.0%) | +0.0% (+0.0%, +0.0%) |",
        "| all on | 150 | 45.0 | -5.0% (-10.0%, +0.0%) | +10.0% (+0.0%, +10.0%) |",
    ]


def test_each_setup_turns_its_feature_back_on_and_all_on_every_one(tmp_path) -> None:
    from bench.harness.feature_cost import servers

    (tmp_path / "ctr" / "1").mkdir(parents=True)
    (tmp_path / "ctr" / "1" / "model.onnx").write_bytes(b"weights")
    setups = {s.name: s.cmd for s in servers(tmp_path / "ctr", tmp_path / "work", sink_port=4317)}
    assert list(setups) == [
        ALL_OFF,
        "statistics",
        "drift",
        "fallback",
        "tracing 1%",
        "canary 10%",
        "request log 1%",
        "drift and canary 10%",
        ALL_ON,
    ]
    flags = {
        name: [
            a
            for a in cmd
            if a.startswith(
                ("--drift", "--fallback", "--tracing", "--canary", "--request_log", "--model_statistics")
            )
        ]
        for name, cmd in setups.items()
    }
    off = ["--drift_window=0", "--fallback_error_rate=0", "--model_statistics=false"]
    assert flags[ALL_OFF] == off
    assert flags["statistics"] == [*off[:2], "--model_statistics=true"]
    assert flags["drift"] == ["--fallback_error_rate=0", "--model_statistics=false", "--drift_window=10000"]
    assert flags["canary 10%"] == [*off, "--canary_percent=10"]
    assert flags[ALL_ON] == [
        "--model_statistics=true",
        "--drift_window=10000",
        "--fallback_error_rate=0.5",
        f"--tracing_config={tmp_path / 'work' / 'tracing_1.json'}",
        "--canary_percent=10",
        f"--request_log_dir={tmp_path / 'work' / 'request_logs' / 'together'}",
        "--request_log_sample_rate=0.01",
    ]
    assert (tmp_path / "work" / "repo" / "ctr" / "2" / "model.onnx").read_bytes() == b"weights"


def test_leave_one_out_turns_on_every_feature_but_one(tmp_path) -> None:
    from bench.harness.feature_cost import feature_flags, setups

    (tmp_path / "ctr" / "1").mkdir(parents=True)
    (tmp_path / "ctr" / "1" / "model.onnx").write_bytes(b"weights")
    _, named = setups(tmp_path / "ctr", tmp_path / "work", sink_port=4317, leave_one_out=True)
    features = list(feature_flags(tmp_path, tmp_path))
    assert list(named) == [ALL_OFF, ALL_ON, *(f"all but {f}" for f in features)]

    def kept(flags: list[str]) -> set[str]:  # each setup logs into a folder of its own
        return {f.split("=")[0] if f.startswith("--request_log_dir") else f for f in flags}

    for feature, its_flags in feature_flags(tmp_path, tmp_path).items():
        names = {flag.split("=")[0] for flag in its_flags}
        its_on = kept([flag for flag in named[ALL_ON] if flag.split("=")[0] in names])
        left = kept(named[f"all but {feature}"])
        assert its_on and not its_on & left  # the feature is off ...
        assert kept(named[ALL_ON]) - its_on <= left  # ... and every other one on
