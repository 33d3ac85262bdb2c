"""The bounded click join in Flink SQL: the statements that run it in the JVM (no pyflink here).

A bounded job over explicit intervals (what `--engine flink` and bench.flink_join run) is one query in Flink's
batch mode. Only the reading of a line runs in Python, one vectorized call per batch of lines
(`pipelines/clicks/flink/bounded.py`), through the Flink job's own `logic.line_event` (the embedded join's
`request_line`, `click_line` and `served`, and its per-file rules: line numbers, a last line still being
written, a bad line dated by the last good one): the rules live there once, and what a request's raw rows are
cannot be said in SQL. The join is here, and follows pipelines/clicks/flink/logic.py `attribute` rule for rule:

- `<stream>_lines`: the filesystem source, `format = raw` with the ISO-8859-1 charset (a byte a character:
  Python gets the line's bytes back exactly), with the file's path, mtime and size;
- `<stream>_parsed`: the lines the embedded join reads, parsed (a file is one split, read in order by one
  subtask, and the parse follows the source in that subtask: it sees each file's lines in order);
- `<stream>_iv`: each event in every interval whose range (widened by the window) holds it, when that
  interval's join opens its file (mtime rule); `<stream>_bad`: a bad line in the interval its time falls in;
- `ranked`, `target`: per (request id, interval), one sort of its requests gives each its group's first, the
  accepted request (the first in file order with raw rows in the interval), else the first logged one window
  either side: the target, which decides what a click on it counts as and which requests are duplicates;
- the counts and the rows, unioned into one result: ("rows", n, order, shadow order, clicked instances) and
  ("counts", n, kind, count). No line is carried through the join: an order names its line (`line_of`).

An order is a string that sorts as logic.py's (file path parts, line number) tuple does:
`<part>\x01<part>...\x01<line number, 12 digits>` (`order_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from pipelines.clicks.events import MTIME_SLACK_S

STREAMS = ("requests", "clicks")
CHARSET = "ISO-8859-1"  # a byte a character: lengths in bytes, the bytes back in Python
# The parse functions' results (bounded.py registers them as parse_<stream>, with these fields): `kept`, a line
# the embedded join reads; `ok`, a good one (else `stamp` is the time a bad line counts at); `okey`, its order.
FIELDS = {
    "requests": (("kept", "BOOLEAN"), ("ok", "BOOLEAN"), ("rid", "STRING"), ("stamp", "DOUBLE"), ("nrows", "BIGINT"),
                 ("shadow", "BOOLEAN"), ("okey", "STRING"), ("mtime", "DOUBLE")),
    "clicks": (("kept", "BOOLEAN"), ("ok", "BOOLEAN"), ("rid", "STRING"), ("stamp", "DOUBLE"),
               ("instance", "BIGINT"), ("mtime", "DOUBLE")),
}  # fmt: skip
BAD_KINDS = {"requests": "bad request lines", "clicks": "bad click lines"}
# The result's columns (one table: rows and counts).
RESULT = ("tag", "n", "okey", "sokey", "clicked", "kind", "cnt")


def order_key(parts: Sequence[str], number: int) -> str:
    """logic.py's order of a request line, (file path parts, line number), as a string that sorts alike."""
    return "\x01".join(parts) + f"\x01{number:012d}"


def line_of(order: str) -> tuple[str, int]:
    """An order's file (relative to its folder's root) and line number."""
    *parts, number = order.split("\x01")
    return "/".join(parts), int(number)


def _q(v: object) -> str:
    return "'" + str(v).replace("'", "''") + "'"


def _double(x: float) -> str:
    return f"CAST({float(x)!r} AS DOUBLE)"


def source_ddl(stream: str, path: str) -> str:
    """The stream's filesystem source, `<stream>_lines`: lines as ISO-8859-1 strings, and file metadata."""
    opts = {"connector": "filesystem", "path": path, "format": "raw", "raw.charset": CHARSET}
    with_ = ", ".join(f"{_q(k)} = {_q(v)}" for k, v in opts.items())
    return (
        f"CREATE TABLE {stream}_lines (line STRING, "
        "path STRING NOT NULL METADATA FROM 'file.path' VIRTUAL, "
        "mtime TIMESTAMP_LTZ(3) NOT NULL METADATA FROM 'file.modification-time' VIRTUAL, "
        "size BIGINT NOT NULL METADATA FROM 'file.size' VIRTUAL) "
        f"WITH ({with_})"
    )


def result_ddl(folder: str) -> str:
    """The sink of the query's result, `joined_files`: CSV files in `folder` (RESULT's columns)."""
    columns = ", ".join(f"{c} {'BIGINT' if c in ('n', 'cnt') else 'STRING'}" for c in RESULT)
    return f"CREATE TABLE joined_files ({columns}) WITH ('connector' = 'filesystem', 'path' = {_q(folder)}, 'format' = 'csv')"


def segments(
    intervals: Sequence[Sequence[float]], widen: float
) -> list[tuple[float, list[tuple[int, float, float]]]]:
    """(upper bound, intervals) in increasing order: a time below a bound (and at or past the one before it) is
    in the [start - widen, end + widen) of those intervals (with no widening, only the first: its own)."""
    ivs = [(int(n), float(s), float(e)) for n, s, e in intervals]
    points = sorted({p for _, s, e in ivs for p in (s - widen, e + widen)})
    out: list[tuple[float, list[tuple[int, float, float]]]] = [(points[0], [])]
    for lo, hi in pairwise(points):  # membership is constant from lo up to hi
        on = [(n, s, e) for n, s, e in ivs if s - widen <= lo < e + widen]
        out.append((hi, on if widen else on[:1]))
    return out


def _unnest(intervals: Sequence[Sequence[float]], widen: float) -> str:
    """`CROSS JOIN UNNEST` of the intervals of `segments` holding column t, as iv(n, s, e): a CASE over the
    bounds, so each event meets only its own intervals (a NULL one when none), never a join with all of them."""

    def array(ivs: list[tuple[int, float, float]]) -> str:
        rows = [f"ROW(CAST({n} AS BIGINT), {_double(s)}, {_double(e)})" for n, s, e in ivs]
        return (
            "ARRAY["
            + ", ".join(rows or ["ROW(CAST(NULL AS BIGINT), CAST(NULL AS DOUBLE), CAST(NULL AS DOUBLE))"])
            + "]"
        )

    cases = " ".join(f"WHEN t < {_double(hi)} THEN {array(ivs)}" for hi, ivs in segments(intervals, widen))
    return f"CROSS JOIN UNNEST(CASE {cases} ELSE {array([])} END) AS iv(n, s, e)"


def views(window_s: float, intervals: Sequence[Sequence[float]]) -> list[tuple[str, str]]:
    """(view name, query) in order; the last, `joined`, is the job's output (RESULT's columns)."""
    w, slack = _double(window_s), _double(MTIME_SLACK_S)
    # Each event joins the few intervals that read it (a per-row array, not a join with a table of them).
    reading, owning = _unnest(intervals, window_s), _unnest(intervals, 0.0)
    out = []
    for stream in STREAMS:
        fields = ", ".join(f"p.{name} AS {name}" for name, _ in FIELDS[stream])
        out.append((
            f"{stream}_parsed",
            f"SELECT {fields} FROM (SELECT parse_{stream}(line, path, CAST(mtime AS STRING), size) AS p "
            f"FROM {stream}_lines) WHERE p.kept",
        ))  # fmt: skip
        # A bad line counts in the interval its time falls in (the last good line's before it in its file, or
        # the file's mtime), when that interval's join opens its file.
        out.append((
            f"{stream}_bad",
            f"SELECT iv.n AS n, {_q(BAD_KINDS[stream])} AS kind FROM "
            f"(SELECT stamp AS t, mtime FROM {stream}_parsed WHERE NOT ok) {owning} "
            f"WHERE iv.n IS NOT NULL AND mtime >= iv.s - {w} - {slack}",
        ))  # fmt: skip
        extra = "nrows, shadow, okey" if stream == "requests" else "instance"
        out.append((
            f"{stream}_iv",
            f"SELECT rid, stamp, {extra}, iv.n AS n, iv.s AS s, iv.e AS e, "
            "(stamp >= iv.s AND stamp < iv.e) AS own "
            f"FROM (SELECT *, stamp AS t FROM {stream}_parsed WHERE ok) {reading} "
            f"WHERE iv.n IS NOT NULL AND mtime >= iv.s - {w} - {slack}",
        ))  # fmt: skip
    out += [
        # Each non-shadow request of a (request id, interval), in the order (pri, order): the accepted request
        # (pri 0: the interval's own, with raw rows), else the first one window either side (pri 1), first; the
        # interval's own without raw rows last (pri 2). One sort gives every row its group's first: the target.
        ("ranked", "SELECT *, ROW_NUMBER() OVER w AS rk, FIRST_VALUE(pri) OVER w AS t_pri, "
         "FIRST_VALUE(okey) OVER w AS t_okey FROM (SELECT rid, n, stamp, nrows, okey, own, CASE WHEN own AND "
         "nrows IS NOT NULL THEN 0 WHEN NOT own THEN 1 ELSE 2 END AS pri FROM requests_iv WHERE NOT shadow) "
         "WINDOW w AS (PARTITION BY rid, n ORDER BY pri, okey)"),
        ("target", "SELECT rid, n, stamp, nrows, okey, pri FROM ranked WHERE rk = 1 AND pri < 2"),
        ("accepted", "SELECT rid, n, okey FROM target WHERE pri = 0"),
        ("shadows", "SELECT rid, n, okey FROM (SELECT rid, n, okey, ROW_NUMBER() OVER "
         "(PARTITION BY rid, n ORDER BY okey) AS rk FROM requests_iv WHERE own AND shadow) WHERE rk = 1"),
        # Each of the interval's own requests after the accepted one is a duplicate; one without raw rows
        # before it (or with none accepted) counts as such.
        ("request_counts", "SELECT n, CASE WHEN nrows IS NULL AND (t_pri <> 0 OR okey < t_okey) "
         "THEN 'requests without raw fields' WHEN t_pri = 0 AND okey > t_okey THEN 'duplicate requests' END "
         "AS kind FROM ranked WHERE own"),
        ("orphans", "SELECT s.n AS n, 'shadow lines without their request' AS kind FROM shadows s "
         "LEFT JOIN accepted a ON s.rid = a.rid AND s.n = a.n WHERE a.rid IS NULL"),
        ("click_kinds", "SELECT c.rid AS rid, c.n AS n, c.s AS s, c.e AS e, c.instance AS instance, "
         "c.stamp AS stamp, c.own AS own, CASE WHEN t.rid IS NULL OR t.nrows IS NULL OR c.instance >= t.nrows "
         "THEN 'unknown clicks' WHEN c.stamp < t.stamp THEN 'clicks before their request' "
         f"WHEN c.stamp > t.stamp + {w} THEN 'late clicks' ELSE 'in window' END AS kind "
         "FROM clicks_iv c LEFT JOIN target t ON c.rid = t.rid AND c.n = t.n"),
        # Per clicked instance: the first click in its window is `clicks` (when the interval owns it), the
        # others it owns are duplicates.
        ("clicked", "SELECT rid, n, instance, CASE WHEN MIN(stamp) >= s AND MIN(stamp) < e THEN 1 ELSE 0 END "
         "AS first_owned, SUM(CASE WHEN own THEN 1 ELSE 0 END) AS owned FROM click_kinds "
         "WHERE kind = 'in window' GROUP BY rid, n, s, e, instance"),
        ("labels", "SELECT rid, n, LISTAGG(CAST(instance AS STRING)) AS clicked FROM clicked GROUP BY rid, n"),
        ("counts", "SELECT n, kind, COUNT(*) AS cnt FROM (SELECT n, kind FROM request_counts WHERE kind "
         "IS NOT NULL UNION ALL SELECT n, kind FROM orphans UNION ALL SELECT n, kind FROM click_kinds "
         "WHERE own AND kind <> 'in window' UNION ALL SELECT n, kind FROM requests_bad UNION ALL "
         "SELECT n, kind FROM clicks_bad) GROUP BY n, kind UNION ALL SELECT n, 'clicks' AS kind, "
         "CAST(SUM(first_owned) AS BIGINT) AS cnt FROM clicked GROUP BY n UNION ALL SELECT n, 'duplicate clicks' "
         "AS kind, CAST(SUM(owned - first_owned) AS BIGINT) AS cnt FROM clicked GROUP BY n"),
        ("joined", "SELECT 'rows' AS tag, a.n AS n, a.okey AS okey, s.okey AS sokey, "
         "l.clicked AS clicked, CAST(NULL AS STRING) AS kind, CAST(NULL AS BIGINT) AS cnt "
         "FROM accepted a LEFT JOIN shadows s ON a.rid = s.rid AND a.n = s.n "
         "LEFT JOIN labels l ON a.rid = l.rid AND a.n = l.n UNION ALL SELECT 'counts', n, CAST(NULL AS STRING), "
         "CAST(NULL AS STRING), CAST(NULL AS STRING), kind, cnt FROM counts"),
    ]  # fmt: skip
    return out
