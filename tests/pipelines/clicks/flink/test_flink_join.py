"""The Flink click join (pipelines/clicks/flink/) equals the embedded one (pipelines/clicks/join.py).

The same request logs and clicks (tests/pipelines/flink_inputs.py: duplicates, retries, late clicks, clock skew,
bad lines, shadow lines, a line still being written, files skipped by their mtime) go through both engines, over
five consecutive intervals: every interval's report (rows, positives, holdout, shadow rows, every count) and
every Parquet partition (train, holdout, shadow; same columns, same rows in the same order) must be equal.

- The keyed rules alone (logic.py, no Flink): events grouped by request id as the job's keyBy groups them.
- The job in a local MiniCluster at parallelism 2 and 1 (five intervals at 1: slow), run in the Flink venv
  (`make flink-venv`, which `make test` installs); skipped, saying so, only where that venv is absent.
- The online trainer's join with `--engine flink` (`flink_join_interval`, join_interval's signature: one
  interval at parallelism 1).
- The Kafka form of the sources, through Flink's SQL parser and validator (never run: no broker here).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.clicks.flink.config import JobConfig, source_ddl
from pipelines.clicks.flink.engine import flink_join_interval, flink_python, read_report, run_job
from pipelines.clicks.flink.logic import (
    BAD,
    REQUEST,
    FileCursor,
    Intervals,
    attribute,
    bad_line_counts,
    line_event,
)
from pipelines.clicks.join import JoinReport, join_interval, partition_name
from pipelines.live_eval.__main__ import join_function
from pipelines.online.__main__ import build_parser
from pipelines.online.step import Settings, join
from tests.helpers import REPO_ROOT
from tests.pipelines.flink_inputs import INTERVAL_S, WINDOW_S, T, make

pytestmark = pytest.mark.slow  # make test-slow: Flink MiniCluster jobs

HOLDOUT = 0.3
INTERVALS = [[n, T + n * INTERVAL_S, T + (n + 1) * INTERVAL_S] for n in range(-1, 4)]
KINDS = {
    "clicks",
    "duplicate clicks",
    "late clicks",
    "clicks before their request",
    "unknown clicks",
    "duplicate requests",
    "requests without raw fields",
    "shadow lines without their request",
    "bad request lines",
    "bad click lines",
}
needs_flink = pytest.mark.skipif(
    flink_python() is None,
    reason="no Flink venv (.venv-flink): `make flink-venv` installs apache-flink + Java 17",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, JoinReport]]:
    """The inputs, and the embedded join's partitions (ROOT/embedded) and reports."""
    root = tmp_path_factory.mktemp("flink-join")
    logs, clicks = make(root)
    reports = {
        n: join_interval(logs, clicks, root / "embedded", n, s, e, WINDOW_S, HOLDOUT) for n, s, e in INTERVALS
    }
    counted = set().union(*(r.counts for r in reports.values()))
    assert counted == KINDS, f"the inputs miss a case: {KINDS - counted}"
    return root, reports


def _assert_equal(
    root: Path, out: Path, embedded: dict[int, JoinReport], flink: dict[int, JoinReport]
) -> None:
    for n, _, _ in INTERVALS:
        assert flink[n] == embedded[n], f"interval {n}:\n embedded {embedded[n]}\n flink    {flink[n]}"
        for part in ("train", "holdout", "shadow"):
            a, b = root / "embedded" / part / partition_name(n), out / part / partition_name(n)
            assert a.is_file() == b.is_file(), f"{part} of interval {n}: only one engine wrote it"
            if a.is_file():
                ta, tb = pq.read_table(a), pq.read_table(b)
                assert ta.schema == tb.schema
                assert ta.equals(tb), f"{part} of interval {n}: the rows differ"
    assert sum(r.rows for r in flink.values()) > 300 and sum(r.shadow_rows for r in flink.values()) > 30


def _keyed_run(logs: Path, clicks: Path, iv: Intervals) -> dict[int, JoinReport]:
    """The job's keyed functions without Flink: lines -> Parse -> keyBy(request id) -> Attribute -> Write."""
    events = []
    for stream, root in (("requests", logs), ("clicks", clicks)):
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            cursor, st = FileCursor(), path.stat()
            mtime = int(st.st_mtime * 1000) / 1000  # Flink's metadata: milliseconds
            for line in path.read_bytes().split(b"\n"):
                e = line_event(stream, str(root), str(path), mtime, st.st_size, line, cursor)
                if e is not None:
                    events.append(e)
    requests, clicks_of = defaultdict(list), defaultdict(list)
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for e in events:
        if e[0] == BAD:
            for _, n, c in bad_line_counts(iv, e):
                counts[n] = {k: counts[n].get(k, 0) + c.get(k, 0) for k in {*counts[n], *c}}
        else:
            (requests if e[0] == REQUEST else clicks_of)[e[1]].append((e[2], e[3], e[4], e[5]))
    out: dict[int, JoinReport] = {}
    for n, start, end in iv.explicit:
        report = JoinReport(n, start, end)
        c = dict(counts[n])
        for key in {*requests, *clicks_of}:
            o = attribute(requests[key], clicks_of[key], start, end, WINDOW_S)
            for k, v in o.counts.items():
                c[k] = c.get(k, 0) + v
            if o.request is not None:
                report.requests += 1
                report.rows += len(o.labels)
                report.positives += sum(o.labels)
        report.counts = dict(sorted(c.items()))
        out[n] = report
    return out


def test_the_keyed_rules_count_as_the_embedded_join(world):
    root, embedded = world
    iv = Intervals(INTERVAL_S, WINDOW_S, tuple((int(n), s, e) for n, s, e in INTERVALS))
    keyed = _keyed_run(root / "logs", root / "clicks", iv)
    for n, _, _ in INTERVALS:
        e = embedded[n]
        assert (keyed[n].requests, keyed[n].rows, keyed[n].positives, keyed[n].counts) == (
            e.requests,
            e.rows,
            e.positives,
            e.counts,
        ), n


def test_intervals_map_times_and_timers_both_ways():
    iv = Intervals(100.0, 30.0)
    assert [iv.of(t) for t in (0.0, 99.999, 100.0, -0.5)] == [0, 0, 1, -1]
    assert iv.bounds(18_000_000) == (1_800_000_000.0, 1_800_000_100.0)
    assert iv.at_timer(iv.timer(7)) == [7] and iv.timer(7) == 830_001
    assert iv.reading(125.0) == [0, 1] and iv.reading(150.0) == [1]  # the widened ranges that read it


def _flink(root: Path, parallelism: int) -> tuple[Path, dict[int, JoinReport]]:
    out, work = root / f"flink-p{parallelism}", root / f"work-p{parallelism}"
    cfg = JobConfig(
        requests={"connector": "filesystem", "path": str(root / "logs")},
        clicks={"connector": "filesystem", "path": str(root / "clicks")},
        out=str(out),
        reports=str(work / "reports"),
        window_s=WINDOW_S,
        holdout=HOLDOUT,
        interval_s=INTERVAL_S,
        explicit=INTERVALS,
        parallelism=parallelism,
    )
    run_job(cfg, work, timeout_s=300)
    return out, {n: read_report(work / "reports", n, s, e) for n, s, e in INTERVALS}


@needs_flink
def test_flink_at_parallelism_2_equals_the_embedded_join(world):
    root, embedded = world
    out, flink = _flink(root, 2)
    _assert_equal(root, out, embedded, flink)


@needs_flink
@pytest.mark.slow  # make test runs parallelism 1 through the online trainer's join (below)
def test_flink_at_parallelism_1_equals_the_embedded_join(world):
    root, embedded = world
    out, flink = _flink(root, 1)
    _assert_equal(root, out, embedded, flink)


@needs_flink
def test_the_online_trainer_joins_on_flink_as_embedded(world, tmp_path: Path):
    root, _ = world
    interval = int(T // INTERVAL_S) + 1
    reports = {}
    for engine in ("embedded", "flink"):
        s = Settings(
            root / "logs", root / "clicks", tmp_path / "repo", tmp_path / engine, INTERVAL_S, WINDOW_S
        )
        reports[engine] = join(dataclasses.replace(s, engine=engine), interval)
        assert reports[engine].rows > 100
    assert reports["flink"] == reports["embedded"]
    for part in ("train", "holdout", "shadow"):
        a = pq.read_table(tmp_path / "embedded" / "data" / part / partition_name(interval))
        assert a.equals(pq.read_table(tmp_path / "flink" / "data" / part / partition_name(interval))), part
    args = build_parser().parse_args(["--logs", "l", "--clicks", "c", "--engine", "flink"])
    assert args.engine == "flink"


KAFKA_DDL_CHECK = """
import json, sys
from pyflink.table import EnvironmentSettings, TableEnvironment
from pipelines.clicks.flink.config import JobConfig, source_ddl
cfg = JobConfig.from_dict(json.loads(sys.argv[1]))
t = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
for stream in ("requests", "clicks"):
    ddl, root = source_ddl(cfg, stream)
    t.execute_sql(ddl)  # parsed and validated (the connector itself is looked up only when a query runs)
    print(json.dumps([stream, root, t.from_path(f"{stream}_src").get_schema().get_field_names()]))
"""


@needs_flink
def test_the_kafka_sources_are_valid_flink_sql(tmp_path: Path):
    """The Kafka form is never run here (no broker, no connector jar): its DDL goes through Flink's own parser
    and catalog, and its columns are those the job reads."""
    kafka = {"connector": "kafka", "topic": "t", "bootstrap_servers": "kafka:9092"}
    cfg = JobConfig(
        requests=kafka, clicks=kafka | {"topic": "c"}, out="o", reports="r", window_s=1, holdout=0
    )
    proc = subprocess.run(
        [str(flink_python()), "-c", KAFKA_DDL_CHECK, json.dumps(cfg.to_dict())],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("[")]
    assert [x[:2] for x in lines] == [["requests", "kafka"], ["clicks", "kafka"]]
    assert all({"line", "path", "mtime", "size"} <= set(x[2]) for x in lines), lines
    assert (
        "'connector' = 'kafka'" in source_ddl(cfg, "requests")[0]
        and "'format' = 'raw'" in source_ddl(cfg, "clicks")[0]
    )


@needs_flink
def test_live_evaluation_with_engine_flink_joins_with_this_job():
    assert join_function("flink") is flink_join_interval and join_function("embedded") is join_interval
