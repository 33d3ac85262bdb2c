"""Live evaluation (`pipelines/live_eval/`): figures per (model, version, label) over the sliding window, equal to an
offline computation on the same joined rows; min rows; the window sliding; pending rows; the gauges on the
metrics port; the join's click anomalies counted."""

from __future__ import annotations

import json
import math
import os
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctr_model.metrics import log_loss, roc_auc
from pipelines.clicks.join import partition_name
from pipelines.live_eval.figures import entropy
from pipelines.live_eval.metrics import LiveMetrics
from pipelines.live_eval.service import LiveEval, Settings
from pipelines.service.flags import serve_metrics
from tests.helpers import free_port
from tests.pipelines.live_world import Version, iso, write_world

T0 = 1_700_000_000.0  # interval 170,000,000 of 10 s starts here, long closed
S = 10.0
STABLE, CANARY = Version(1, "stable", 80.0), Version(2, "canary", 20.0, noise=1.5, bias=0.4, canary=True)


def _settings(tmp: Path, **kw) -> Settings:
    base = {"interval_s": S, "window_s": 30.0, "attribution_window_s": 5.0, "min_rows": 100}
    return Settings(tmp / "logs", tmp / "clicks", tmp / "state", **{**base, **kw})


def _evaluate(tmp: Path, seconds: float, metrics: LiveMetrics | None = None, **kw) -> tuple[LiveEval, dict]:
    ev = LiveEval(_settings(tmp, **kw), metrics, first=int(T0 // S))
    ev.run(until=T0 + seconds)
    return ev, json.loads((tmp / "state" / "snapshot.json").read_text())


def _offline(state: Path, intervals: range) -> dict[tuple, dict]:
    """Figures per key from the joined partitions themselves, computed directly."""
    tables = [
        pq.read_table(state / "joined" / part / partition_name(j))
        for j in intervals
        for part in ("train", "holdout", "shadow")
        if (state / "joined" / part / partition_name(j)).is_file()
    ]
    t = pa.concat_tables(tables).to_pydict()
    groups: dict[tuple, list[tuple[int, float]]] = {}
    for m, v, lab, y, s in zip(
        t["model"], t["version"], t["version_label"], t["label"], t["score"], strict=True
    ):
        groups.setdefault((m, v, lab or "none"), []).append((y, s))
    out = {}
    for k, rows in groups.items():
        y, s = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        loss = log_loss(y, s)
        out[k] = {
            "rows": len(y),
            "positives": int(y.sum()),
            "auc": roc_auc(y, s),
            "logloss": loss,
            "ne": loss / entropy(y.mean()),
            "calibration_ratio": s.sum() / y.sum(),
        }
    return out


def _by_key(snapshot: dict) -> dict[tuple, dict]:
    return {(f["model"], f["version"], f["label"]): f for f in snapshot["figures"]}


def test_figures_equal_an_offline_computation_on_the_same_joined_rows(tmp_path: Path):
    write_world(tmp_path, T0, 60, 150, [STABLE, CANARY], shadow=Version(3, "shadow", 0.0, noise=0.2))
    ev, snap = _evaluate(tmp_path, 60)
    first = int(T0 // S)
    history = [json.loads(line) for line in (tmp_path / "state" / "history.jsonl").read_text().splitlines()]
    assert [h["interval"] for h in history] == list(range(first, first + 6))
    assert snap == history[-1] and snap["window_end"] - snap["window_start"] == 30.0
    offline = _offline(tmp_path / "state", range(first + 3, first + 6))
    live = _by_key(snap)
    assert set(live) == set(offline) == {("ctr", 1, "stable"), ("ctr", 2, "canary"), ("ctr", 3, "shadow")}
    for k, want in offline.items():
        got = live[k]
        assert (got["rows"], got["positives"], got["observed"]) == (
            want["rows"],
            want["positives"],
            want["positives"],
        )
        assert got["auc"] == pytest.approx(want["auc"], abs=1e-9)
        for name in ("logloss", "ne", "calibration_ratio"):
            assert got[name] == pytest.approx(want[name], rel=1e-9), name
        assert 0 < got["auc_var"] < 0.01
    # the world's truth shows: the noisy, biased canary ranks worse and over-predicts; shadow (little noise) best
    assert (
        live[("ctr", 3, "shadow")]["auc"]
        > live[("ctr", 1, "stable")]["auc"]
        > live[("ctr", 2, "canary")]["auc"]
    )
    assert live[("ctr", 2, "canary")]["calibration_ratio"] > 1.2
    assert 0.8 < live[("ctr", 1, "stable")]["calibration_ratio"] < 1.25
    assert ev.window.rows == snap["window_rows"] == sum(f["rows"] for f in snap["figures"])


def test_below_min_rows_only_the_counts_are_shown_and_the_gauges_follow(tmp_path: Path):
    write_world(tmp_path, T0, 40, 100, [STABLE, CANARY])
    metrics, port = LiveMetrics(), free_port()
    serve_metrics(metrics.registry, port, "127.0.0.1")
    # 30 s of 100 requests/s: stable ~2,400 rows, canary ~600
    _, snap = _evaluate(tmp_path, 40, metrics, min_rows=1000)
    stable, canary = _by_key(snap)[("ctr", 1, "stable")], _by_key(snap)[("ctr", 2, "canary")]
    assert stable["rows"] >= 1000 > canary["rows"] > 0
    assert all(stable[k] is not None for k in ("auc", "auc_var", "logloss", "ne", "calibration_ratio"))
    assert all(canary[k] is None for k in ("auc", "auc_var", "logloss", "ne", "calibration_ratio"))
    assert canary["positives"] > 0 and canary["predicted"] > 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {
        (s.name, s.labels.get("version"), s.labels.get("label"), s.labels.get("kind")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("ctr_live_joined_rows", "1", "stable", None)] == stable["rows"]
    assert samples[("ctr_live_joined_rows", "2", "canary", None)] == canary["rows"]
    assert samples[("ctr_live_auc", "1", "stable", None)] == pytest.approx(stable["auc"])
    assert samples[("ctr_live_calibration_ratio", "1", "stable", None)] == pytest.approx(
        stable["calibration_ratio"]
    )
    assert ("ctr_live_auc", "2", "canary", None) not in samples  # below --min-rows: not exported
    assert ("ctr_live_logloss", "2", "canary", None) not in samples
    assert samples[("ctr_live_last_interval_end_seconds", None, None, None)] == snap["window_end"]
    assert samples[("ctr_live_click_events_total", None, None, "clicks")] > 0


def test_the_window_slides_old_versions_out_and_counts_pending_rows(tmp_path: Path):
    old = Version(1, "stable", 100.0, until=T0 + 20)
    new = Version(4, "stable", 100.0, noise=0.3, since=T0 + 20)
    write_world(tmp_path, T0, 100, 60, [old, new])
    ev = LiveEval(_settings(tmp_path), first=int(T0 // S))
    keys = []
    for _ in range(6):
        ev.run(intervals=1)
        keys.append(
            {f["version"] for f in json.loads((tmp_path / "state" / "snapshot.json").read_text())["figures"]}
        )
    # window 30 s: version 1 (the first 20 s) is in the window until the interval ending at +50 s
    assert keys == [{1, 4}, {1, 4}, {1, 4}, {1, 4}, {4}, {4}]
    assert len(ev.window.parts) == 3 and min(ev.window.parts) == int(T0 // S) + 3
    snap = json.loads((tmp_path / "state" / "snapshot.json").read_text())
    # pending: rows logged after the window end (60 s), over at most one interval, one attribution window and
    # the 2 s grace (what a live evaluator has open)
    v4 = _by_key(snap)[("ctr", 4, "stable")]
    assert v4["pending"] == 60 * (S + 5.0 + 2.0)
    # the joined partitions of intervals outside the window stay for --keep-joined-s
    assert (tmp_path / "state" / "joined" / "train" / partition_name(int(T0 // S))).is_file()


def test_click_anomalies_are_counted_by_kind_and_carried_over_a_restart(tmp_path: Path):
    logs, clicks = tmp_path / "logs", tmp_path / "clicks"
    logs.mkdir()
    clicks.mkdir()
    lines = [
        json.dumps(
            {
                "request_id": f"a{i}",
                "time": iso(T0 + i),
                "model": {"name": "ctr", "version": 1},
                "inputs": {"instances": [{"I1": 1}]},
                "outputs": [[0.5]],
            }
        )
        for i in range(5)
    ]
    (logs / "requests-1-1.jsonl").write_text("\n".join([*lines, "{broken"]) + "\n")
    os.utime(logs / "requests-1-1.jsonl", (T0 + 5, T0 + 5))
    events = [
        {"request_id": "a0", "instance": 0, "time": T0 + 1},
        {"request_id": "a0", "instance": 0, "time": T0 + 2},  # duplicate
        {"request_id": "a1", "instance": 0, "time": T0 + 0.5},  # before its request
        {"request_id": "a2", "instance": 0, "time": T0 + 8},  # late (window 5 s)
        {"request_id": "nobody", "instance": 0, "time": T0 + 3},  # unknown
    ]
    text = "\n".join(json.dumps(e) for e in sorted(events, key=lambda e: e["time"])) + "\nnot json\n"
    (clicks / "clicks-1.jsonl").write_text(text)
    os.utime(clicks / "clicks-1.jsonl", (T0 + 9, T0 + 9))
    ev, snap = _evaluate(tmp_path, 10, min_rows=1)
    want = {
        "clicks": 1,
        "duplicate clicks": 1,
        "clicks before their request": 1,
        "late clicks": 1,
        "unknown clicks": 1,
        "bad click lines": 1,
        "bad request lines": 1,
    }
    assert snap["counts"] == ev.state.counts == want
    # the model logged no label: "none"; one positive in five rows
    (f,) = snap["figures"]
    assert (f["label"], f["rows"], f["positives"], f["auc"]) == ("none", 5, 1, None)
    assert f["calibration_ratio"] == pytest.approx(2.5) and f["ne"] == pytest.approx(
        math.log(2) / entropy(0.2)
    )
    restarted = LiveMetrics()
    LiveEval(_settings(tmp_path, min_rows=1), restarted)
    assert restarted.registry.get_sample_value("ctr_live_click_events_total", {"kind": "late clicks"}) == 1.0


def test_the_command_line_refuses_bad_settings_with_a_reason(tmp_path: Path, capsys: pytest.CaptureFixture):
    from pipelines.live_eval.__main__ import main

    base = ["--logs", str(tmp_path), "--clicks", str(tmp_path), "--state-dir", str(tmp_path / "state")]
    assert main([*base, "--window-s", "5", "--interval-s", "10", "--metrics-port", "0"]) == 2
    assert "--window-s (5) must hold at least one interval (10 s)" in capsys.readouterr().err
    assert main([*base, "--interval-s", "0", "--metrics-port", "0"]) == 2
    assert "need --interval-s > 0" in capsys.readouterr().err
    LiveEval(_settings(tmp_path), first=int(T0 // S))  # a state of 10 s intervals, 5 s attribution window
    assert main([*base, "--interval-s", "10", "--attribution-window-s", "60", "--metrics-port", "0"]) == 1
    assert "was evaluated with --interval-s 10 --attribution-window-s 5" in capsys.readouterr().err


def test_anomalies_are_logged_once_a_minute_per_kind_and_counted_every_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    (tmp_path / "logs").mkdir()
    (tmp_path / "clicks").mkdir()
    request = {
        "model": {"name": "ctr", "version": 1},
        "inputs": {"instances": [{"I1": 1}]},
        "outputs": [[0.5]],
    }
    lines = [json.dumps({**request, "request_id": f"a{j}", "time": iso(T0 + S * j)}) for j in range(3)]
    (tmp_path / "logs" / "requests-1-1.jsonl").write_text("\n".join(lines) + "\n")
    os.utime(tmp_path / "logs" / "requests-1-1.jsonl", (T0 + 20, T0 + 20))
    late = [{"request_id": f"a{j}", "instance": 0, "time": T0 + S * j + 7} for j in range(3)]  # window 5 s
    (tmp_path / "clicks" / "clicks-1.jsonl").write_text("\n".join(json.dumps(c) for c in late) + "\n")
    os.utime(tmp_path / "clicks" / "clicks-1.jsonl", (T0 + 30, T0 + 30))
    with caplog.at_level("WARNING", logger="pipelines.live_eval"):
        ev, _ = _evaluate(tmp_path, 30, min_rows=1)
    assert ev.state.counts == {"late clicks": 3}
    said = [r.getMessage() for r in caplog.records if "late clicks" in r.getMessage()]
    assert said == [
        "1 late clicks counted and dropped by the live evaluation's join (at most one line per kind per minute)"
    ]
