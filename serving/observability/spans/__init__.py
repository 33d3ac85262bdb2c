"""Tracing's OpenTelemetry side, imported only when tracing is on (serving/observability/tracing.py).

`sdk.py`: the tracer (the sampling decision, spans as plain records); `otlp_wire.py`: the span queue and the
records written as OTLP wire bytes; `export_process.py`: the process that sends those bytes through the SDK's
exporter, so that no gRPC or HTTP client runs in the serving process (docs/decisions/0010-span-export-process.md).
"""
