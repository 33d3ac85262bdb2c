"""The span export process (serving/observability/spans/export_process.py): the SDK's exporter in a child
process, fed OTLP wire bytes over a socket, against a real gRPC receiver; a dead collector, a killed child and a
stuck one each cost their spans (counted), never the exporter."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from random import getrandbits
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from serving.observability.spans import export_process
from serving.observability.spans.export_process import ExportProcess
from serving.observability.spans.otlp_wire import INTERNAL, Encoded, encode_records, scope_head
from tests.helpers import free_port
from tests.serving.otlp_receiver import OtlpReceiver

HEAD = scope_head(Resource.create({"service.name": "t"}), InstrumentationScope("ctr-serving"))


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.stop()


def _request(spans: int) -> tuple[int, Encoded]:
    """An export request of `spans` spans of one new trace: (its trace id, the request)."""
    trace = getrandbits(128) or 1
    now = time.time_ns()
    records = [
        (trace, i + 1, 0, False, f"s{i}", INTERNAL, now, now + 1000, None, (), None) for i in range(spans)
    ]
    data = encode_records(records, HEAD)
    assert data is not None
    return trace, Encoded(data, spans)


def _exporter(endpoint: str, timeout_s: float = 5.0) -> tuple[ExportProcess, list[int]]:
    drops: list[int] = []
    settings = {"protocol": "grpc", "endpoint": endpoint, "export_timeout_s": timeout_s}
    return ExportProcess(settings, drops.append), drops


def _child(exporter: ExportProcess) -> Any:
    child = exporter._child
    assert child is not None
    return child


def _until(check: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.05)


def test_the_child_sends_each_request(receiver: OtlpReceiver) -> None:
    exporter, drops = _exporter(receiver.endpoint)
    try:
        for spans in (1, 7, 300):
            trace, request = _request(spans)
            assert exporter.export(request) is SpanExportResult.SUCCESS  # handed over
            found = receiver.wait(lambda t=trace, n=spans: len(f := receiver.trace(f"{t:032x}")) == n and f)
            assert sorted(s["name"] for s in found) == sorted(f"s{i}" for i in range(spans))
            assert {s["service"] for s in found} == {"t"}
        child = _child(exporter)
    finally:
        exporter.shutdown()
    assert child.returncode == 0 and drops == []  # it ended at the end of its input, everything sent
    assert exporter.export(_request(1)[1]) is SpanExportResult.FAILURE  # shut down: nothing more goes


def test_a_dead_collector_counts_the_spans_dropped_and_the_child_lives_on() -> None:
    exporter, drops = _exporter(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)  # nobody listens there
    try:
        assert exporter.export(_request(3)[1]) is SpanExportResult.SUCCESS  # the child takes it, then fails
        assert exporter.export(_request(4)[1]) is SpanExportResult.SUCCESS  # after the first one failed
        assert sum(drops) == 3  # the first one's, read when the second was handed over
        child = _child(exporter)
    finally:
        exporter.shutdown(timeout_s=5.0)
    assert child.returncode == 0 and sum(drops) == 7  # the second one's, read at the shutdown


def test_a_killed_child_is_started_again(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_process, "RESTART_EVERY_S", 0.0)
    exporter, drops = _exporter(receiver.endpoint)
    try:
        trace, request = _request(2)
        assert exporter.export(request) is SpanExportResult.SUCCESS
        receiver.wait(lambda: len(receiver.trace(f"{trace:032x}")) == 2)
        first = _child(exporter)
        first.send_signal(signal.SIGKILL)
        first.wait()
        trace, request = _request(2)
        assert exporter.export(request) is SpanExportResult.SUCCESS  # a new child took it
        assert _child(exporter).pid != first.pid
        receiver.wait(lambda: len(receiver.trace(f"{trace:032x}")) == 2)
    finally:
        exporter.shutdown()
    assert drops == []  # the first child had sent its frame before it was killed


def test_a_stuck_child_is_killed_its_frame_dropped_and_replaced(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export_process, "START_GRACE_S", 0.5)
    monkeypatch.setattr(export_process, "RESTART_EVERY_S", 0.0)
    exporter, drops = _exporter(receiver.endpoint, timeout_s=1.0)
    try:
        trace, request = _request(1)
        assert exporter.export(request) is SpanExportResult.SUCCESS
        receiver.wait(lambda: len(receiver.trace(f"{trace:032x}")) == 1)
        stuck = _child(exporter)
        os.kill(stuck.pid, signal.SIGSTOP)  # alive, doing nothing
        assert exporter.export(_request(5)[1]) is SpanExportResult.SUCCESS  # handed over, never sent
        started = time.monotonic()
        assert exporter.export(_request(1)[1]) is SpanExportResult.FAILURE  # waited for the last: stuck
        assert time.monotonic() - started < 5
        assert stuck.poll() is not None and drops == [5]  # killed, its frame counted
        trace, request = _request(1)
        assert exporter.export(request) is SpanExportResult.SUCCESS  # the next child
        receiver.wait(lambda: len(receiver.trace(f"{trace:032x}")) == 1)
    finally:
        exporter.shutdown()
