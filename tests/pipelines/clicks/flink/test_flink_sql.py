"""The SQL form of the bounded Flink join (pipelines/clicks/flink/sql.py) agrees with logic.py's rules, without Flink.

The whole query is held equal to the embedded join by tests/pipelines/clicks/flink/test_flink_join.py (slow); here
the two pieces of it that are computed in Python and handed to SQL as text: which intervals read a time (the
CASE over bounds each event is unnested through) and the order of request lines (a string standing in for
logic.py's (file path parts, line number) tuple).
"""

from __future__ import annotations

import random

from pipelines.clicks.flink.logic import Intervals
from pipelines.clicks.flink.sql import line_of, order_key, segments, views

WINDOW_S = 30.0
EXPLICIT = [[17, 1700.0, 1800.0], [18, 1800.0, 1900.0], [20, 2000.0, 2100.0], [21, 2100.0, 2150.5]]


def _lookup(table: list[tuple[float, list[tuple[int, float, float]]]], t: float) -> list[int]:
    """What the SQL CASE does: the first bound above t names the intervals."""
    return next(([n for n, _, _ in ivs] for hi, ivs in table if t < hi), [])


def test_segments_give_each_time_the_intervals_that_read_it_and_the_one_that_owns_it():
    iv = Intervals(100.0, WINDOW_S, tuple((int(n), s, e) for n, s, e in EXPLICIT))
    reading, owning = segments(EXPLICIT, WINDOW_S), segments(EXPLICIT, 0.0)
    edges = [p for _, s, e in EXPLICIT for x in (s, e) for p in (x - WINDOW_S, x, x + WINDOW_S)]
    rng = random.Random(3)
    times = edges + [e - 1e-9 for e in edges] + [rng.uniform(1600.0, 2250.0) for _ in range(2000)]
    for t in times:
        assert _lookup(reading, t) == iv.reading(t), t
        own = iv.of(t)
        assert _lookup(owning, t) == ([] if own is None else [own]), t
    assert _lookup(reading, 1669.999) == [] and _lookup(reading, 1670.0) == [17]
    assert _lookup(reading, 1830.0) == [18] and _lookup(reading, 1829.9) == [17, 18]


def test_order_keys_sort_as_logic_orders_and_name_their_line():
    orders = [
        (("pod-1", "requests-1-2.jsonl"), 7),
        (("pod-1", "requests-1-2.jsonl"), 12),
        (("pod-1", "requests-1-10.jsonl"), 1),
        (("pod-1.a", "requests-1-1.jsonl"), 3),
        (("pod-10", "requests-0-1.jsonl"), 2),
        (("requests-9.jsonl",), 100),
    ]
    assert sorted(orders, key=lambda o: order_key(*o)) == sorted(orders)
    assert line_of(order_key(("pod-1", "requests-1-2.jsonl"), 12)) == ("pod-1/requests-1-2.jsonl", 12)


def test_the_query_ends_in_the_joined_result():
    names = [name for name, _ in views(WINDOW_S, EXPLICIT)]
    assert names[-1] == "joined" and len(names) == len(set(names))
    assert {"requests_parsed", "clicks_parsed", "target", "counts"} <= set(names)
