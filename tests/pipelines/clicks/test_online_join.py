"""The click join (`pipelines/clicks/join.py`): window, duplicates, late clicks, clicks before requests, unknown ids,
the serving columns (model, version, version label, canary, score) and shadow lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq

from pipelines.clicks.join import held_out, join_interval, partition_name
from serving.observability.request_log import sampled

T = 1_800_000_000.0  # interval 0 of these tests starts here; intervals are 100 s, the window 30 s
ROW = {"I1": 3, "I5": 1382, "C1": "68fd1e64", "C9": "a73ee510"}


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _requests(folder: Path, *reqs: tuple[str, float, int]) -> None:
    """(id, time, instances) -> one request log file, in time order, mtime = the last time."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "requests-1-1.jsonl"
    with path.open("a") as f:
        for rid, t, n in reqs:
            f.write(
                json.dumps({"request_id": rid, "time": _iso(t), "inputs": {"instances": [ROW] * n}}) + "\n"
            )
    os.utime(path, (reqs[-1][1], reqs[-1][1]))


def _clicks(folder: Path, *clicks: tuple[str, int, float] | str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "clicks-1.jsonl"
    with path.open("a") as f:
        for c in clicks:
            line = (
                c if isinstance(c, str) else json.dumps({"request_id": c[0], "instance": c[1], "time": c[2]})
            )
            f.write(line + "\n")
    os.utime(path, (T + 1000, T + 1000))


def _join(tmp: Path, interval: int = 0):
    start = T + 100 * interval
    return join_interval(tmp / "logs", tmp / "clicks", tmp / "out", interval, start, start + 100, 30.0, 0.0)


def _labels(tmp: Path, interval: int = 0) -> dict[tuple[str, int], int]:
    t = pq.read_table(tmp / "out" / "train" / partition_name(interval)).to_pydict()
    return {(r, i): y for r, i, y in zip(t["request_id"], t["instance"], t["label"], strict=True)}


def test_a_click_inside_the_window_is_a_positive_and_outside_it_a_late_click(tmp_path: Path):
    _requests(tmp_path / "logs", ("a", T + 10, 2), ("b", T + 20, 1))
    _clicks(tmp_path / "clicks", ("a", 1, T + 40), ("b", 0, T + 50.001))  # a/1 at +30 s exactly; b at +30.001
    r = _join(tmp_path)
    assert _labels(tmp_path) == {("a", 0): 0, ("a", 1): 1, ("b", 0): 0}
    assert (r.requests, r.rows, r.positives, r.counts) == (2, 3, 1, {"clicks": 1, "late clicks": 1})


def test_duplicate_clicks_count_once_and_label_once(tmp_path: Path):
    _requests(tmp_path / "logs", ("a", T + 10, 1))
    _clicks(tmp_path / "clicks", ("a", 0, T + 12), ("a", 0, T + 12), ("a", 0, T + 15))
    r = _join(tmp_path)
    assert _labels(tmp_path) == {("a", 0): 1}
    assert r.counts == {"clicks": 1, "duplicate clicks": 2}


def test_clicks_before_their_request_and_unknown_ids_are_counted_not_joined(tmp_path: Path):
    _requests(tmp_path / "logs", ("a", T + 10, 1), ("b", T + 50, 1))
    _clicks(
        tmp_path / "clicks",
        ("b", 0, T + 40),  # before its request (clock skew)
        ("nobody", 0, T + 41),  # an id never logged
        ("a", 5, T + 42),  # an instance the request does not have
        ("a", 0, T + 38),
    )
    r = _join(tmp_path)
    assert _labels(tmp_path) == {("a", 0): 1, ("b", 0): 0}
    assert r.counts == {"clicks": 1, "clicks before their request": 1, "unknown clicks": 2}


def test_each_click_is_counted_by_one_interval_and_labels_across_the_boundary(tmp_path: Path):
    # a request near the end of interval 0 clicked early in interval 1; a late click for it in interval 1
    _requests(tmp_path / "logs", ("a", T + 90, 1), ("c", T + 150, 1))
    _clicks(tmp_path / "clicks", ("a", 0, T + 105), ("a", 0, T + 110), ("c", 0, T + 125), ("a", 0, T + 121))
    first, second = _join(tmp_path, 0), _join(tmp_path, 1)
    assert _labels(tmp_path, 0) == {("a", 0): 1} and _labels(tmp_path, 1) == {("c", 0): 0}
    assert first.counts == {}  # no click falls inside interval 0
    assert second.counts == {
        "clicks": 1,
        "duplicate clicks": 1,
        "late clicks": 1,
        "clicks before their request": 1,
    }


def test_bad_lines_and_repeated_requests_are_counted_once(tmp_path: Path):
    _requests(tmp_path / "logs", ("a", T + 10, 1), ("a", T + 11, 1))
    with (tmp_path / "logs" / "requests-1-1.jsonl").open("a") as f:
        f.write("{not json\n")
    os.utime(tmp_path / "logs" / "requests-1-1.jsonl", (T + 11, T + 11))
    _clicks(tmp_path / "clicks", ("a", 0, T + 12), '{"request_id": "a"}', "garbage")
    with (tmp_path / "clicks" / "clicks-1.jsonl").open("a") as f:
        f.write('{"request_id": "a", "instance": 0')
    os.utime(tmp_path / "clicks" / "clicks-1.jsonl", (T + 1000, T + 1000))
    r = _join(tmp_path)
    # the last click line has no newline yet (being written): left for a later read, not counted
    assert r.counts == {"bad click lines": 2, "bad request lines": 1, "clicks": 1, "duplicate requests": 1}
    assert _labels(tmp_path) == {("a", 0): 1}


def test_a_bad_line_near_an_interval_edge_counts_in_one_interval_only(tmp_path: Path):
    # Each join reads one window either side of its interval; a bad line there is its neighbour's to count.
    logs = tmp_path / "logs" / "requests-1-1.jsonl"
    _requests(tmp_path / "logs", ("a", T + 95, 1))
    with logs.open("a") as f:
        f.write("{not json\n")  # counted by the time of the line before it: T + 95, interval 0
    _requests(tmp_path / "logs", ("b", T + 105, 1))
    _clicks(tmp_path / "clicks", ("b", 0, T + 106), "garbage")  # after b's click: T + 106, interval 1
    reports = [_join(tmp_path, n) for n in range(3)]
    assert [r.counts.get("bad request lines", 0) for r in reports] == [1, 0, 0]
    assert [r.counts.get("bad click lines", 0) for r in reports] == [0, 1, 0]


def test_an_interval_without_requests_writes_no_partition(tmp_path: Path):
    _requests(tmp_path / "logs", ("a", T + 10, 1))
    r = _join(tmp_path, 3)
    assert (r.rows, r.counts) == (0, {})
    assert not (tmp_path / "out" / "train" / partition_name(3)).exists()


def test_holdout_takes_whole_requests_by_hash_of_the_id(tmp_path: Path):
    _requests(tmp_path / "logs", *[(f"r{i}", T + i * 0.1, 2) for i in range(200)])
    r = join_interval(tmp_path / "logs", tmp_path / "c", tmp_path / "out", 0, T, T + 100, 30.0, 0.25)
    held = pq.read_table(tmp_path / "out" / "holdout" / partition_name(0)).to_pydict()
    assert r.holdout_rows == len(held["label"]) == 2 * len(set(held["request_id"]))
    assert 60 < r.holdout_rows < 140 and r.rows == 400


def test_request_logs_in_one_folder_per_pod_are_all_joined(tmp_path: Path):
    # k8s serving pods each write --request_log_dir=/var/log/ctr/$(POD_NAME): same file names, other folders.
    _requests(tmp_path / "logs" / "ctr-serving-a", ("a", T + 10, 1))
    _requests(tmp_path / "logs" / "ctr-serving-b", ("b", T + 20, 2))
    _clicks(tmp_path / "clicks", ("b", 1, T + 25))
    r = _join(tmp_path)
    assert _labels(tmp_path) == {("a", 0): 0, ("b", 0): 0, ("b", 1): 1}
    assert (r.requests, r.rows, r.positives) == (2, 3, 1)


def _served_line(rid: str, t: float, n: int, **extra) -> str:
    entry = {"request_id": rid, "time": _iso(t), "inputs": {"instances": [ROW] * n}, **extra}
    return json.dumps(entry)


def _write_lines(folder: Path, lines: list[str], mtime: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "requests-1-1.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    os.utime(path, (mtime, mtime))


def _columns(tmp: Path, part: str = "train", interval: int = 0) -> list[tuple]:
    names = ["request_id", "instance", "label", "model", "version", "version_label", "canary", "score"]
    t = pq.read_table(tmp / "out" / part / partition_name(interval), columns=names).to_pydict()
    return sorted(zip(*(t[c] for c in names), strict=True))


def test_rows_carry_the_model_version_label_canary_and_logged_score(tmp_path: Path):
    _write_lines(
        tmp_path / "logs",
        [
            _served_line(
                "a",
                T + 10,
                2,
                model={"name": "ctr", "version": 3, "label": "stable"},
                canary=False,
                shadow=False,
                outputs=[[0.25], [0.5]],
            ),
            _served_line(
                "b",
                T + 11,
                1,
                model={"name": "ctr", "version": 4, "label": "canary"},
                canary=True,
                outputs=[[0.75]],
            ),
            # an older server: no label, canary or shadow fields
            _served_line("c", T + 12, 1, model={"name": "ctr", "version": 3}, outputs=[[0.125]]),
            # no model field and no outputs at all: nulls, never a refused line
            _served_line("d", T + 13, 1),
        ],
        T + 13,
    )
    _clicks(tmp_path / "clicks", ("a", 1, T + 20), ("b", 0, T + 21))
    r = _join(tmp_path)
    assert _columns(tmp_path) == [
        ("a", 0, 0, "ctr", 3, "stable", False, 0.25),
        ("a", 1, 1, "ctr", 3, "stable", False, 0.5),
        ("b", 0, 1, "ctr", 4, "canary", True, 0.75),
        ("c", 0, 0, "ctr", 3, None, False, 0.125),
        ("d", 0, 0, None, None, None, False, None),
    ]
    assert (r.rows, r.positives, r.shadow_rows, r.counts) == (5, 2, 0, {"clicks": 2})


def test_shadow_lines_join_the_same_clicks_into_their_own_partition(tmp_path: Path):
    stable = {"name": "ctr", "version": 3, "label": "stable"}
    shadow = {"name": "ctr", "version": 5, "label": "shadow"}
    _write_lines(
        tmp_path / "logs",
        [
            _served_line("a", T + 10, 2, model=stable, outputs=[[0.25], [0.5]]),
            json.dumps(
                {
                    "request_id": "a",
                    "time": _iso(T + 10),
                    "model": shadow,
                    "shadow": True,
                    "canary": False,
                    "inputs": None,
                    "outputs": [[0.3], [0.6]],
                }
            ),
            _served_line("b", T + 20, 1, model=stable, outputs=[[0.1]]),
            # a retried request: its primary counts once as a duplicate, its shadow line is skipped
            _served_line("a", T + 30, 2, model=stable, outputs=[[0.25], [0.5]]),
            json.dumps(
                {
                    "request_id": "a",
                    "time": _iso(T + 30),
                    "model": shadow,
                    "shadow": True,
                    "outputs": [[0.9], [0.9]],
                }
            ),
            # a shadow line whose request was not logged with raw rows
            json.dumps(
                {"request_id": "z", "time": _iso(T + 31), "model": shadow, "shadow": True, "outputs": [[0.9]]}
            ),
        ],
        T + 31,
    )
    _clicks(tmp_path / "clicks", ("a", 1, T + 15))
    r = _join(tmp_path)
    assert _columns(tmp_path) == [
        ("a", 0, 0, "ctr", 3, "stable", False, 0.25),
        ("a", 1, 1, "ctr", 3, "stable", False, 0.5),
        ("b", 0, 0, "ctr", 3, "stable", False, 0.1),
    ]
    assert _columns(tmp_path, "shadow") == [
        ("a", 0, 0, "ctr", 5, "shadow", False, 0.3),
        ("a", 1, 1, "ctr", 5, "shadow", False, 0.6),
    ]
    assert (r.requests, r.rows, r.positives, r.shadow_rows) == (2, 3, 1, 2)
    assert r.counts == {"clicks": 1, "duplicate requests": 1, "shadow lines without their request": 1}
    assert not (tmp_path / "out" / "holdout").exists()


def test_a_shadow_line_written_after_later_requests_is_still_joined(tmp_path: Path):
    # shadow scoring runs off the client's path: its line (stamped with the request's time) may follow lines of
    # requests logged seconds later; a reader stops in a file only 60 s (ORDER_SLACK_S) past its range's end
    stable, shadow = (
        {"name": "ctr", "version": 1, "label": "stable"},
        {"name": "ctr", "version": 2, "label": "shadow"},
    )
    _write_lines(
        tmp_path / "logs",
        [
            _served_line("a", T + 90, 1, model=stable, outputs=[[0.2]]),
            _served_line(
                "b", T + 150, 1, model=stable, outputs=[[0.3]]
            ),  # interval 1, past this read's range
            json.dumps(
                {"request_id": "a", "time": _iso(T + 90), "model": shadow, "shadow": True, "outputs": [[0.4]]}
            ),
        ],
        T + 150,
    )
    r = _join(tmp_path)
    assert _columns(tmp_path, "shadow") == [("a", 0, 0, "ctr", 2, "shadow", False, 0.4)]
    assert (r.rows, r.shadow_rows, r.counts) == (1, 1, {})


def test_the_holdout_of_the_logged_requests_is_its_fraction_whatever_the_ids():
    """The request log samples by crc32 of the id: the holdout draw must not follow it. Before, with an unmixed
    crc32 both ways, every 1%-sampled id of one length fell on one side: counting ids of 5 digits all held out,
    UUIDs none."""
    families = {
        "counting": [f"sim1-{i}" for i in range(10_000, 400_000)],
        "uuid-like": [f"{i:08x}-4b1d-4c2e-9f3a-{i * 7919:012x}" for i in range(400_000)],
    }
    for name, ids in families.items():
        logged = [i for i in ids if sampled(i, 0.01)]
        share = sum(held_out(i, 0.2) for i in logged) / len(logged)
        assert len(logged) > 2_000 and 0.17 < share < 0.23, (name, len(logged), share)
