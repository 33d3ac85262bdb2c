"""A real OTLP trace receiver for the tests: OTLP's TraceService (opentelemetry-proto) on a gRPC server.

It keeps every span the server exports, flattened to dicts (`spans`), and can write them as JSON for the
span-tree picture of docs/serving.md (tests/serving/trace_picture.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        time.sleep(self.receiver.delay_s)  # a slow collector
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": KINDS.get(span.kind, str(span.kind)),
                            "start_ns": span.start_time_unix_nano,
                            "end_ns": span.end_time_unix_nano,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            "status": span.status.code,
                            "service": resource.get("service.name"),
                        }
                    )
        with self.receiver.lock:
            self.receiver.spans.extend(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """Listening on 127.0.0.1:`port` until stop(); each export answered after `delay_s`."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = grpc.server(ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]

    def wait(self, check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
        """Poll `check()` until it returns something truthy; fail after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = check()
            if found:
                return found
            assert time.monotonic() < deadline, f"not received in {timeout_s}s; spans: {self.spans[-20:]}"
            time.sleep(0.05)

    def dump(self, spans: list[dict[str, Any]], path: Path) -> None:
        path.write_text(json.dumps(spans, indent=1))

    def stop(self) -> None:
        self.server.stop(grace=None)
