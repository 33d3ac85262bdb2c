"""The span exporter's own process: the SDK's OTLP exporter (gRPC or HTTP), fed encoded requests over a socket.

The span queue's thread (otlp_wire.SpanQueue) hands each export request, written as OTLP wire bytes, to
`ExportProcess.export`, which sends it to a child process: one system call. The child (`python -m
serving.observability.spans.export_process FD SETTINGS`) is the SDK's exporter, unchanged (its channel, TLS,
headers, compression, retries, OTEL_EXPORTER_OTLP_* variables), sending the bytes as they are; it counts what
it sent and failed in a shared page (a memfd both map), which the parent reads without a system call.

Why a process (docs/decisions/0010-span-export-process.md): the SDK's synchronous gRPC client, run on a thread
of the serving process, takes the GIL back several times a call and wakes gRPC's own threads, and each time
the event loop's thread hands the GIL over and takes it back. At 10% sampling that cost the server 4.8 µs a
request of a 15 µs single raw row. Each system call of the span thread is such a handover too: it sends, and
reads the child's counts from memory.

A frame is 8 bytes (the request's length and its span count, little-endian u32 each), then the request. One
frame is handed over at a time: the next is sent once the child has finished the last (the queue's bound,
`max_queue_size`, stays what waits), and the spans of a frame the child failed to send are counted as dropped
when the next export (or the shutdown) reads the counts. A child that died is started again at the next
export; one that does not finish a frame within the export timeout (plus a grace for its start) is killed, its
frame counted as dropped. It ends at the end of its input: the server's shutdown, or the server's death.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from serving.observability.spans.otlp_wire import Encoded

log = logging.getLogger(__name__)

QUIET_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)
EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
FRAME = struct.Struct("<II")  # the request's length, its span count
COUNTS = struct.Struct("<QQ")  # in the shared page: frames finished, spans that failed
SEND_BUFFER = 1 << 20  # a whole export request (512 spans: about 100 KB) in one send, as the kernel allows
POLL_S = 0.002  # while the child still sends the last frame (a slow collector), how often its counts are read
START_GRACE_S = 30.0  # a first export also waits for the child's imports (about 1 s on an idle machine)
RESTART_EVERY_S = 5.0  # a child that keeps dying is started at most this often; exports fail meanwhile
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the folder that holds `serving/`


def endpoint_of(settings: dict[str, Any]) -> tuple[str, str]:
    """(protocol, endpoint) the exporter sends to: the settings', else OTEL_EXPORTER_OTLP_*'s, else the SDK's
    defaults (a gRPC collector on localhost:4317)."""
    protocol = settings["protocol"] or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    )
    if protocol == "grpc":
        return protocol, str(
            settings["endpoint"] or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317")
        )
    return "http/protobuf", str(
        _http_endpoint(settings["endpoint"])
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")
    )


def _http_endpoint(endpoint: str | None) -> str | None:
    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        return endpoint.rstrip("/") + "/v1/traces"  # as the SDK appends it to OTEL_EXPORTER_OTLP_ENDPOINT
    return endpoint


class ExportProcess(SpanExporter):
    """The span queue's exporter: each request handed to the child process, one at a time."""

    def __init__(self, settings: dict[str, Any], on_drop: Callable[[int], None]) -> None:
        """`settings`: the tracing file's `protocol`, `endpoint` and `export_timeout_s`; `on_drop(n)`: counts
        spans the child failed to send (the span queue counts those it was refused)."""
        self._settings = {k: settings[k] for k in ("protocol", "endpoint", "export_timeout_s")}
        self._wait_s = float(settings["export_timeout_s"]) + START_GRACE_S
        self._on_drop = on_drop
        self._child: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._counts: mmap.mmap | None = None
        self._sent = self._failed = 0  # frames handed to this child; its failed spans counted so far
        self._last_spans = 0  # the spans of the last frame handed over
        self._started_at = -RESTART_EVERY_S
        self._shutdown = False
        self._start()

    def _start(self) -> bool:
        now = time.monotonic()
        if now - self._started_at < RESTART_EVERY_S:
            return False
        self._started_at = now
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=_PACKAGE_ROOT + (os.pathsep + path if path else ""))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        ours.setsockopt(  # a child that stopped reading fails the send after this long (the kernel's timeout)
            socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(self._wait_s), 0)
        )
        page = os.memfd_create("ctr-span-export")
        try:
            os.ftruncate(page, mmap.PAGESIZE)
            counts = mmap.mmap(page, mmap.PAGESIZE)
            child = subprocess.Popen(
                [sys.executable, "-m", __name__, str(page), json.dumps(self._settings)],
                stdin=theirs.fileno(),
                env=env,
                pass_fds=(page,),
            )
        except OSError as exc:
            log.warning("tracing: cannot start the span export process: %s", exc)
            ours.close()
            return False
        finally:
            os.close(page)
            theirs.close()
        self._child, self._sock, self._counts = child, ours, counts
        self._sent = self._failed = self._last_spans = 0
        return True

    def _finished(self) -> int:
        """Frames the child has finished; the spans it failed since the last look are counted as dropped."""
        assert self._counts is not None
        frames, failed = COUNTS.unpack_from(self._counts)
        if failed > self._failed:
            self._on_drop(failed - self._failed)
            self._failed = failed
        return int(frames)

    def _stop(self, child: subprocess.Popen[bytes], kill: bool, timeout_s: float = 0.0) -> None:
        """Let the child go (killed when `kill`, else after `timeout_s`); a frame it did not finish is dropped."""
        if kill:
            child.kill()
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if self._finished() < self._sent:
            self._on_drop(self._last_spans)
        if self._sock is not None:
            self._sock.close()
        self._child = self._sock = self._counts = None

    def export(self, spans: Any) -> SpanExportResult:
        """Hand one request (`Encoded`) to the child; FAILURE (its spans dropped) when there is none to take it."""
        if self._shutdown:
            return SpanExportResult.FAILURE
        child = self._child
        if child is not None and child.poll() is not None:
            log.warning("tracing: the span export process ended (%s); starting another", child.returncode)
            self._stop(child, False)
            child = None
        if child is None and not self._start():
            return SpanExportResult.FAILURE
        child, sock = self._child, self._sock
        assert child is not None and sock is not None
        if self._finished() < self._sent:  # the last frame is still being sent: a slow collector
            deadline = time.monotonic() + self._wait_s
            while self._finished() < self._sent:
                if child.poll() is not None or time.monotonic() > deadline:
                    # Stuck or dead: its frame is dropped, and the next export starts another.
                    self._stop(child, True)
                    return SpanExportResult.FAILURE
                time.sleep(POLL_S)
        try:
            sock.sendall(FRAME.pack(len(spans.data), spans.spans) + spans.data)
        except OSError:  # the child died (EPIPE) or stopped reading (EAGAIN: the kernel's timeout)
            self._stop(child, True)
            return SpanExportResult.FAILURE
        self._sent += 1
        self._last_spans = spans.spans
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # a request is the child's once handed over

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Let the child send what it was given (killed after `timeout_s`), then stop it."""
        self._shutdown = True
        child, sock = self._child, self._sock
        if child is None or sock is None:
            return
        with contextlib.suppress(OSError):  # a dead child's socket
            sock.shutdown(socket.SHUT_WR)  # the end of its input
        self._stop(child, False, timeout_s)


class _OncePerMinute(logging.Filter):
    """Lets one record a minute through (per logger)."""

    def __init__(self) -> None:
        super().__init__()
        self._last = -60.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last < 60.0:
            return False
        self._last = now
        return True


def quiet_exporter_logs() -> None:
    """The exporters' retry lines at most once a minute (tracing.py warns with the count of dropped spans)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).addFilter(_OncePerMinute())


class _BytesStub:
    """TraceService's stub for requests already written as bytes (no message object to serialize)."""

    def __init__(self, channel: Any) -> None:
        self.Export = channel.unary_unary(EXPORT_PATH, request_serializer=_data, response_deserializer=None)


def _data(request: Encoded) -> bytes:
    return request.data


def sdk_exporter(settings: dict[str, Any]) -> SpanExporter:
    """The SDK's OTLP exporter of the settings' protocol, sending requests written as bytes (`Encoded`)."""
    protocol, _ = endpoint_of(settings)
    endpoint, timeout = settings["endpoint"], float(settings["export_timeout_s"])
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        class WireExporter(GrpcExporter):
            """The SDK's gRPC exporter (its channel, metadata, retries), its requests sent as written."""

            def _initialize_channel_and_stub(self) -> None:
                super()._initialize_channel_and_stub()
                self._client = _BytesStub(self._channel)  # type: ignore[assignment]

            def _translate_data(self, data: Any) -> Any:
                return data

            def _count_data(self, data: Any) -> int:
                return int(data.spans)

        return WireExporter(endpoint=endpoint, timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    class HttpWireExporter(HttpExporter):
        """The SDK's HTTP exporter (its session, headers, compression, retries), its requests sent as written."""

        def export(self, spans: Any) -> SpanExportResult:
            if self._shutdown:
                return SpanExportResult.FAILURE
            sent = self._client.export(spans.data).success
            return SpanExportResult.SUCCESS if sent else SpanExportResult.FAILURE

    return HttpWireExporter(endpoint=_http_endpoint(endpoint), timeout=timeout)


def main(page: int, settings_json: str) -> None:
    """The child: send each framed request from stdin until it ends, counting in the shared `page`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to act on
    logging.basicConfig(level=logging.WARNING, format="span-export: %(levelname)s %(name)s: %(message)s")
    quiet_exporter_logs()
    counts = mmap.mmap(page, mmap.PAGESIZE)
    exporter = sdk_exporter(json.loads(settings_json))
    stdin = sys.stdin.buffer
    frames = failed = 0
    while len(head := stdin.read(FRAME.size)) == FRAME.size:
        size, spans = FRAME.unpack(head)
        data = stdin.read(size)
        if len(data) < size:
            break
        try:
            sent = exporter.export(Encoded(data, spans)) is SpanExportResult.SUCCESS  # type: ignore[arg-type]
        except Exception:  # an exporter's bug: these spans are dropped, the next ones still go
            log.exception("span export failed")
            sent = False
        frames, failed = frames + 1, failed + (0 if sent else spans)
        COUNTS.pack_into(counts, 0, frames, failed)
    exporter.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
