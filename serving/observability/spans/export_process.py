"""The span exporter's own process: the SDK's OTLP exporter (gRPC or HTTP), fed encoded requests through a pipe.

The span queue's thread (otlp_wire.SpanQueue) hands each export request, written as OTLP wire bytes, to
`ExportProcess.export`, which writes it to a child process and waits for the child's one-byte answer (sent or
not): the queue's backpressure and drop counting stay as they were. The child (`python -m
serving.observability.spans.export_process SETTINGS`) is the SDK's exporter, unchanged (its channel, TLS,
headers, compression, retries, OTEL_EXPORTER_OTLP_* variables), sending the bytes as they are.

Why a process (docs/decisions/0010-span-export-process.md): the SDK's synchronous gRPC client, run on a thread
of the serving process, takes the GIL back several times a call and wakes gRPC's own threads, each time
waiting out the event loop's switch interval. At 10% sampling that cost the server 5.6 µs a request of a
15 µs single raw row; through the child, the span thread only writes to a pipe and reads a byte.

A frame is 8 bytes (the request's length and its span count, little-endian u32 each), then the request. The
child answers each with b"1" (sent) or b"0" (not: its spans are counted as dropped). A child that died is
started again at the next export; one that does not answer within its timeout is killed. It ends at the end
of its input: the server's shutdown, or the server's death (the pipe closes with it).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
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
SENT, NOT_SENT = b"1", b"0"
SEND_BUFFER = 1 << 20  # a whole export request (512 spans: about 100 KB) in one send, as the kernel allows
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
    """The span queue's exporter: each request sent by the child process, the answer awaited."""

    def __init__(self, settings: dict[str, Any]) -> None:
        """`settings`: the tracing file's `protocol`, `endpoint` and `export_timeout_s`."""
        self._settings = {k: settings[k] for k in ("protocol", "endpoint", "export_timeout_s")}
        self._wait_s = float(settings["export_timeout_s"]) + START_GRACE_S
        self._child: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._started_at = -RESTART_EVERY_S
        self._shutdown = False
        self._start()

    def _start(self) -> subprocess.Popen[bytes] | None:
        now = time.monotonic()
        if now - self._started_at < RESTART_EVERY_S:
            return None
        self._started_at = now
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=_PACKAGE_ROOT + (os.pathsep + path if path else ""))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # One send and one receive an export, each bounded by the kernel (SO_SNDTIMEO, SO_RCVTIMEO): no
        # select, no second system call, each of which would take the GIL back once more.
        seconds = struct.pack("ll", int(self._wait_s), int(self._wait_s % 1 * 1e6))
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, seconds)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, seconds)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__, json.dumps(self._settings)],
                stdin=theirs,
                stdout=theirs,
                env=env,
            )
            self._sock = ours
        except OSError as exc:
            log.warning("tracing: cannot start the span export process: %s", exc)
            self._child = None
            ours.close()
        theirs.close()
        return self._child

    def export(self, spans: Any) -> SpanExportResult:
        """Send one request (`Encoded`); SUCCESS once the child says it was sent."""
        child = self._child
        if self._shutdown:
            return SpanExportResult.FAILURE
        if child is None or child.poll() is not None:
            if child is not None:
                log.warning("tracing: the span export process ended (%s); starting another", child.returncode)
                self._close_socket()
            child = self._start()
            if child is None:
                return SpanExportResult.FAILURE
        try:
            self._sock.sendall(FRAME.pack(len(spans.data), spans.spans) + spans.data)
            answer = self._sock.recv(1)
        except OSError:  # the child died (EPIPE) or is stuck (EAGAIN: the kernel's timeout)
            answer = b""
        if answer == SENT:
            return SpanExportResult.SUCCESS
        if answer != NOT_SENT:  # dead or stuck: the next export starts another
            child.kill()
            child.wait()
        return SpanExportResult.FAILURE

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # an export returns once the child has sent it

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Let the child finish what it was given, then stop it (killed after `timeout_s`)."""
        self._shutdown = True
        child, self._child = self._child, None
        if child is None:
            return
        if self._sock is not None:
            self._sock.shutdown(socket.SHUT_WR)  # the end of its input
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        self._close_socket()


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


def main(settings_json: str) -> None:
    """The child: send each framed request from stdin, answer each on stdout, until stdin ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to act on
    logging.basicConfig(level=logging.WARNING, format="span-export: %(levelname)s %(name)s: %(message)s")
    quiet_exporter_logs()
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(
        sys.stderr.fileno(), sys.stdout.fileno()
    )  # whatever a library prints goes to stderr, not the answers
    exporter = sdk_exporter(json.loads(settings_json))
    stdin = sys.stdin.buffer
    while len(head := stdin.read(FRAME.size)) == FRAME.size:
        size, spans = FRAME.unpack(head)
        data = stdin.read(size)
        if len(data) < size:
            break
        try:
            sent = exporter.export(Encoded(data, spans)) is SpanExportResult.SUCCESS
        except Exception:  # an exporter's bug: these spans are dropped, the next ones still go
            log.exception("span export failed")
            sent = False
        answers.write(SENT if sent else NOT_SENT)
    exporter.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
