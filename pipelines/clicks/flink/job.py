"""The click join as an Apache Flink job (PyFlink DataStream API over Table API sources), run in the Flink venv:

    .venv-flink/bin/python -m pipelines.clicks.flink.job --config JOB.json

A bounded job over explicit intervals (`bounded_sql`: what `--engine flink` and bench.flink_join run) is Flink
SQL in batch mode, in the JVM but for the parsing of lines (pipelines/clicks/flink/sql.py, bounded.py). Any
other job (continuous sources, a restore, no explicit intervals) is this DataStream graph (docs/flink-join.md):

    requests source ─┐
                     ├─ keyBy(file) ─ Parse ─ keyBy(request id) ─ Attribute ─ keyBy(interval) ─ Write
    clicks source ───┘

- Sources (`config.source_ddl`): the filesystem connector, `format = raw` (one record a line) with the file's
  path, size and mtime, bounded or monitoring the folder continuously; or Kafka topics (configuration only).
- Parse (keyed by file): numbers each file's lines, parses them (pipelines/clicks/flink/logic.py, the embedded
  join's own parsing) into request, click and bad-line events.
- Attribute (keyed by request id; bad lines by their kind): the interval join of a request id's requests and
  clicks. Its events stay in keyed state; at an event-time timer (interval end + attribution window) the
  interval's labels and counts are emitted and events no later interval needs are dropped (a continuous job
  also closes the next interval of every key it saw, so a key that goes quiet leaves no state behind).
- Write (keyed by interval): at the same timer, writes the interval's train/holdout Parquet partitions (join.py's
  own table and hash holdout) and REPORTS/interval-N.json (the JoinReport; written last, atomically).

Watermarks: none when the sources are bounded (end of input closes every interval); bounded out-of-orderness of
`lag_s` (and `idle_s` idleness) when they are continuous. Counts are also Flink metrics (`ctr_join_<kind>`).
"""

from __future__ import annotations

import argparse
import json
import os
import site
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyflink.common import Configuration, Duration, Row, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import KeyedProcessFunction, RuntimeContext, StreamExecutionEnvironment
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor
from pyflink.table import StreamTableEnvironment

from pipelines.clicks.flink import bounded
from pipelines.clicks.flink.config import JobConfig, flink_settings, source_ddl
from pipelines.clicks.flink.logic import (
    BAD,
    REQUEST,
    FileCursor,
    Intervals,
    attribute,
    bad_line_counts,
    line_event,
)
from pipelines.clicks.flink.output import write_interval

PICKLED = Types.PICKLED_BYTE_ARRAY()


class Parse(KeyedProcessFunction):  # type: ignore[misc]
    """Keyed by (stream, file): each line, in file order, as an event."""

    def __init__(self, roots: dict[str, str]) -> None:
        self.roots = roots

    def open(self, ctx: RuntimeContext) -> None:
        self.cursor = ctx.get_state(ValueStateDescriptor("cursor", PICKLED))

    def process_element(self, value: Any, ctx: Any) -> Any:
        stream, line, path, mtime, size = value
        cursor = self.cursor.value() or FileCursor()
        event = line_event(stream, self.roots[stream], path, mtime, size, line, cursor)
        self.cursor.update(cursor)
        if event is not None:
            yield event


def _key(e: tuple[Any, ...]) -> str:
    """Request and click events by request id; bad lines (kind, not an id) by their kind, after a NUL."""
    return "\0" + e[1] if e[0] == BAD else e[1]


class Attribute(KeyedProcessFunction):  # type: ignore[misc]
    """Keyed by request id: its requests and clicks until their intervals close (the interval join); a bad
    line becomes a count in the interval its time falls in (once, as the embedded join counts it)."""

    def __init__(self, intervals: Intervals) -> None:
        self.iv = intervals

    def open(self, ctx: RuntimeContext) -> None:
        self.requests = ctx.get_list_state(ListStateDescriptor("requests", PICKLED))
        self.clicks = ctx.get_list_state(ListStateDescriptor("clicks", PICKLED))
        self.behind = ctx.get_metrics_group().counter("ctr_join_events_behind_watermark")

    def process_element(self, e: Any, ctx: Any) -> Any:
        if e[0] == BAD:
            yield from bad_line_counts(self.iv, e)
            return
        n = self.iv.of(e[2])
        if n is not None:
            timer = self.iv.timer(n)
            if timer <= ctx.timer_service().current_watermark():
                self.behind.inc()  # its interval is already written: the watermark's lag was too short
                return
            ctx.timer_service().register_event_time_timer(timer)
            if (
                not self.iv.explicit
            ):  # the next interval's close drops what this one kept (an idle key's state)
                ctx.timer_service().register_event_time_timer(self.iv.timer(n + 1))
        if e[0] == REQUEST:
            self.requests.add((e[2], e[3], e[4], e[5]))
        else:
            self.clicks.add((e[2], e[3], e[4], e[5]))

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        requests, clicks = list(self.requests.get() or []), list(self.clicks.get() or [])
        keep = None
        for n in self.iv.at_timer(timestamp):
            start, end = self.iv.bounds(n)
            o = attribute(requests, clicks, start, end, self.iv.window_s)
            if o.request is not None:
                yield ("row", n, o.request, o.labels, o.shadow)
            if o.counts:
                yield ("counts", n, o.counts)
            keep = end - self.iv.window_s
        if keep is None:
            return
        requests = [r for r in requests if r[0] >= keep]
        clicks = [c for c in clicks if c[0] >= keep]
        self.requests.update(requests)
        self.clicks.update(clicks)


class Write(KeyedProcessFunction):  # type: ignore[misc]
    """Keyed by interval: its rows and counts until it closes, then its partitions and report."""

    def __init__(self, cfg: JobConfig, intervals: Intervals) -> None:
        self.cfg, self.iv = cfg, intervals

    def open(self, ctx: RuntimeContext) -> None:
        self.rows = ctx.get_list_state(ListStateDescriptor("rows", PICKLED))
        self.counts = ctx.get_list_state(ListStateDescriptor("counts", PICKLED))
        self.done = ctx.get_state(ValueStateDescriptor("done", Types.BOOLEAN()))
        self.metrics = ctx.get_metrics_group()
        self.counters: dict[str, Any] = {}

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.done.value():
            self._counter("events_behind_watermark").inc()
            return
        kind, n = value[0], value[1]
        ctx.timer_service().register_event_time_timer(self.iv.timer(n))
        (self.rows if kind == "row" else self.counts).add(value[2:])
        return iter(())

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        n = ctx.get_current_key()
        if self.done.value():
            return
        counts: dict[str, int] = {}
        for (part,) in self.counts.get() or []:
            for kind, k in part.items():
                counts[kind] = counts.get(kind, 0) + k
        start, end = self.iv.bounds(n)
        report = write_interval(self.cfg, n, start, end, list(self.rows.get() or []), counts)
        for kind, k in counts.items():
            self._counter(kind).inc(k)
        self.rows.clear()
        self.counts.clear()
        self.done.update(True)
        yield report

    def _counter(self, kind: str) -> Any:
        if kind not in self.counters:
            self.counters[kind] = self.metrics.counter("ctr_join_" + kind.replace(" ", "_"))
        return self.counters[kind]


class EventTime(TimestampAssigner):  # type: ignore[misc]
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value[2] * 1000)


def _lines(t_env: Any, stream: str) -> Any:
    """A source table's rows as (stream, line, path, mtime, size) tuples (mtime: a UTC time string in SQL,
    Unix seconds here, as milliseconds: the metadata's precision)."""

    def row(r: Row) -> tuple[Any, ...]:
        mtime = datetime.fromisoformat(str(r[2])).replace(tzinfo=UTC).timestamp()
        return (stream, bytes(r[0]), str(r[1]), mtime, int(r[3]))

    query = f"SELECT line, path, CAST(mtime AS STRING), size FROM {stream}_src"
    return t_env.to_data_stream(t_env.sql_query(query)).map(row, output_type=PICKLED)


def _environment(cfg: JobConfig, **settings: str) -> tuple[Any, Any]:
    """A fresh (stream environment, table environment) with cfg's Flink settings (and `settings`)."""
    env = StreamExecutionEnvironment.get_execution_environment(Configuration())
    env.get_config().set_global_job_parameters({})
    conf = Configuration()
    for k, v in (flink_settings(cfg) | settings).items():
        conf.set_string(k, v)
    env.configure(conf)
    if cfg.parallelism > 0:  # else the cluster's parallelism.default (a FlinkDeployment's job.parallelism)
        env.set_parallelism(cfg.parallelism)
    t_env = StreamTableEnvironment.create(env)
    t_env.get_config().set_local_timezone("UTC")
    return env, t_env


def bounded_sql(cfg: JobConfig) -> bool:
    """Whether the job runs as Flink SQL (bounded.py): bounded filesystem sources over explicit intervals."""
    return not cfg.continuous and bool(cfg.explicit) and not cfg.restore


def build(cfg: JobConfig) -> Any:
    """The job graph on a fresh environment; returns the environment (call execute on it)."""
    env, t_env = _environment(cfg)
    roots = {}
    for stream in ("requests", "clicks"):
        ddl, roots[stream] = source_ddl(cfg, stream)
        t_env.execute_sql(ddl)
    iv = cfg.intervals()
    lines = _lines(t_env, "requests").union(_lines(t_env, "clicks"))
    events = lines.key_by(lambda x: x[0] + "\0" + x[2], key_type=Types.STRING()).process(
        Parse(roots), output_type=PICKLED
    )
    if cfg.continuous:
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(int(cfg.lag_s * 1000)))
        strategy = strategy.with_idleness(Duration.of_millis(int(cfg.idle_s * 1000)))
        events = events.assign_timestamps_and_watermarks(strategy.with_timestamp_assigner(EventTime()))
    # Bad lines go through Attribute too (keyed apart from every request id): one Python call an event.
    joined = events.key_by(_key, key_type=Types.STRING()).process(Attribute(iv), output_type=PICKLED)
    joined.key_by(lambda x: x[1], key_type=Types.LONG()).process(
        Write(cfg, iv), output_type=Types.STRING()
    ).print()
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pipelines.clicks.flink.job", description="the click join on Flink")
    p.add_argument("--config", type=Path, required=True, help="the job's JSON configuration")
    args = p.parse_args(argv)
    cfg = JobConfig.from_dict(json.loads(args.config.read_text()))
    # Thread mode runs the functions in an interpreter embedded in the JVM (started below, with this
    # environment): it finds pyflink, pemja and this repository through PYTHONPATH.
    paths = [
        *site.getsitepackages(),
        str(Path(__file__).resolve().parents[3]),
        os.environ.get("PYTHONPATH", ""),
    ]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if bounded_sql(cfg):
        # Batch mode: bounded input, sort and hash joins in managed memory, no state and no retractions.
        # Vectorized Python functions run in Python workers (process mode), not in the JVM's interpreter.
        settings = {
            "execution.runtime-mode": "batch",
            "python.execution-mode": "process",
            "pipeline.name": cfg.name,
        }
        _, t_env = _environment(cfg, **settings)
        for report in bounded.run(t_env, cfg):
            print(report, flush=True)
        return 0
    build(cfg).execute(cfg.name)
    return 0


if __name__ == "__main__":
    # Through the module's own name: the functions are then pickled for the workers by reference, not by value.
    from pipelines.clicks.flink import job

    sys.exit(job.main())
