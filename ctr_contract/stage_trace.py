"""A span per stage of a training run or an export, when the OpenTelemetry variables ask for it (as the server reads them).

`OTEL_TRACES_EXPORTER=otlp` or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` turns it on (`OTEL_SDK_DISABLED=true`
or `OTEL_TRACES_EXPORTER=none` keep it off); the SDK (pyproject.toml's `tracing` extra) is imported only then,
and its absence only logs a line. `run("training")` (or `run("export")`) is the run's span, the child of `TRACEPARENT` when the
environment has one (scripts/daily.sh sets one, so training and export of a day are one trace);
`stage("fit")` is one stage inside it. The OpenTelemetry import is lazy and optional: the contract still runs on
the standard library alone. `wanted` is also the server's rule for the variables (serving/observability/tracing.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)
_tracer: list[Any] = []  # the run's tracer while run() is open


def wanted(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether the OTEL_* variables ask for traces (the server's rule, serving/observability/tracing.py)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return "otlp" in exporter.split(",")
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


@contextmanager
def run(name: str, **attributes: Any) -> Iterator[None]:
    """The whole run as one span (a no-op unless wanted); its spans are flushed when it ends."""
    if not wanted() or _tracer:
        yield
        return
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        log.warning(
            "OTEL_* variables are set but the OpenTelemetry SDK is not installed: no trace of this run"
        )
        yield
        return
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    )
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", f"ctr-{name}")})
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER, else every run
    provider.add_span_processor(BatchSpanProcessor(Http() if protocol == "http/protobuf" else Grpc()))
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ.get("TRACEPARENT", "")})
    tracer = provider.get_tracer(f"ctr-{name}")
    _tracer.append(tracer)
    try:
        with tracer.start_as_current_span(name, context=parent, attributes=attributes):
            yield
    finally:
        _tracer.clear()
        provider.shutdown()  # exports what is left (bounded by the exporter's timeout)


@contextmanager
def stage(name: str, **attributes: Any) -> Iterator[None]:
    """One stage's span inside run(); a no-op outside one."""
    if not _tracer:
        yield
        return
    with _tracer[0].start_as_current_span(name, attributes=attributes):
        yield
