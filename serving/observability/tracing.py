"""Opt-in OpenTelemetry tracing of the predict path: one span per request, children for each stage.

Off unless `--tracing_config FILE` is given or the SDK's own variables ask for it (`OTEL_TRACES_EXPORTER=otlp`,
or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keep it
off). While off, the OpenTelemetry SDK is never imported and the request path pays one test of `ACTIVE`.

The tree of one request (docs/serving.md shows one):
    predict | infer                 the request (SERVER): model name, version, signature, batch size, status
      decode                        the body or the TensorProtos -> a DecodedRequest
      queue_wait                    from the batcher's queue into a batch (`--enable_batching`)
      batch                         one model call: links to every request it carries, its rows
        transform                   the raw signature's FeatureSpec transform
        model_run                   the model itself
      encode                        the scores -> the response body
A batch carrying several requests is the child of the first and linked from all (a span has one parent).

W3C `traceparent` is read from the REST header and the gRPC metadata, and returned (a response header, the
trailing metadata); a malformed one is ignored and a new trace started. Sampling is parent-based with a
ratio. A sampled request's spans are plain records on the request path; they leave through a bounded queue
and a thread that hands them in batches to the exporter's own process (serving/observability/spans/): when
the collector is down or slow, spans are dropped, never waited for; the drops are counted
(`ctr_serving_trace_spans_dropped_total`) and a warning is logged at most once a minute.

The config file is JSON; every key is optional (defaults in `DEFAULTS`):
    {"endpoint": "http://127.0.0.1:4317", "protocol": "grpc" | "http/protobuf", "sample_ratio": 0.01,
     "max_queue_size": 2048, "schedule_delay_ms": 1000, "export_timeout_s": 5, "service_name": "ctr-serving"}
Variables set in the environment (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, OTEL_BSP_*,
OTEL_EXPORTER_OTLP_*) apply where the file does not name the setting.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from ctr_contract import stage_trace

log = logging.getLogger(__name__)

ACTIVE = False  # True once setup() has installed a tracer: the request path tests only this
# A request without a traceparent is a root, sampled when 64 random bits are under ROOT_BOUND (the trace id's
# low half, TraceIdRatioBased's rule); 2^64 with any other sampler than a parent-based ratio. Set by setup().
ROOT_BOUND = 0
_CURRENT: ContextVar[Any] = ContextVar("ctr_request_span", default=None)  # the request's recording span
_begin_grpc: Callable[[str, bytes], tuple[Any, Any, bytes]]  # spans/sdk.py's starters, set by setup()
_begin_plain_rest: Callable[[str, bytes], tuple[Any, Any, bytes]]
_state: dict[str, Any] = {}
DEFAULTS: dict[str, Any] = {
    "endpoint": None,  # None: the SDK's (OTEL_EXPORTER_OTLP_ENDPOINT, else localhost)
    "protocol": None,  # None: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc
    "sample_ratio": None,  # None: OTEL_TRACES_SAMPLER(_ARG), else 1.0
    "max_queue_size": None,  # None: OTEL_BSP_MAX_QUEUE_SIZE, else 2048
    "schedule_delay_ms": None,  # None: OTEL_BSP_SCHEDULE_DELAY, else 1000
    "export_timeout_s": 5.0,
    "service_name": None,  # None: OTEL_SERVICE_NAME, else ctr-serving
}
WARN_EVERY_S = 60.0


def wanted(config_file: Path | None, env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether tracing is asked for: a config file, or the SDK's variables (see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return config_file is not None or stage_trace.wanted(env)


def read_config(config_file: Path | None) -> dict[str, Any]:
    """The settings of `config_file` over DEFAULTS; ValueError naming the file for a bad one."""
    settings = dict(DEFAULTS)
    if config_file is None:
        return settings
    try:
        given = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tracing_config {config_file}: {exc}") from exc
    if not isinstance(given, dict) or set(given) - set(DEFAULTS):
        raise ValueError(f"--tracing_config {config_file}: a JSON object with keys among {sorted(DEFAULTS)}")
    settings.update(given)
    ratio = settings["sample_ratio"]
    if ratio is not None and not (isinstance(ratio, int | float) and 0.0 <= ratio <= 1.0):
        raise ValueError(f"--tracing_config {config_file}: sample_ratio must be in [0, 1], got {ratio!r}")
    if settings["protocol"] not in (None, "grpc", "http/protobuf"):
        raise ValueError(f"--tracing_config {config_file}: protocol must be grpc or http/protobuf")
    return settings


def root_ratio(ratio: float | None) -> float | None:
    """The root sampling ratio of a parent-based ratio sampler (the file's, or OTEL_TRACES_SAMPLER's
    parentbased_* ones); None for any other sampler, which the SDK then runs on every request
    (serving/observability/spans/sdk.py)."""
    if ratio is not None:
        return float(ratio)
    name = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    fixed = {"parentbased_always_on": 1.0, "parentbased_always_off": 0.0}
    if name in fixed:
        return fixed[name]
    if name == "parentbased_traceidratio":
        try:
            value = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
        except ValueError:
            return 1.0  # as the SDK does with an argument that is no number
        return value if 0.0 <= value <= 1.0 else 1.0
    return None


def setup(
    config_file: Path | None,
    service_name: str = "ctr-serving",
    on_drop: Callable[[int], object] | None = None,
) -> bool:
    """Install the tracer when tracing is wanted; True when it is on. Called once per serving process.
    `on_drop(n)` counts dropped spans where the metrics page reads them (the shared counter under workers)."""
    global ACTIVE, ROOT_BOUND, _begin_grpc, _begin_plain_rest, begin_rest, child, batch
    if ACTIVE or not wanted(config_file):
        return ACTIVE
    from serving.observability.spans.sdk import build_tracer  # the SDK is imported only from here

    settings = read_config(config_file)
    settings["service_name"] = settings["service_name"] or os.environ.get("OTEL_SERVICE_NAME") or service_name
    settings["sample_ratio"] = root_ratio(settings["sample_ratio"])
    _state.update(build_tracer(settings, _dropped))
    _state["dropped"], _state["warned_at"], _state["on_drop"] = 0, -WARN_EVERY_S, on_drop
    child, batch, starter = _state["child"], _state["batch"], _state["starter"]
    _begin_grpc, _begin_plain_rest = starter(_CURRENT, "GRPC"), starter(_CURRENT, "REST")
    begin_rest, ROOT_BOUND = starter(_CURRENT, "REST", b"\r\ntraceparent: "), _state["root_bound"]
    ACTIVE = True
    log.info("tracing on: OTLP %s to %s", _state["protocol"], _state["endpoint"])
    return True


def shutdown(timeout_s: float = 2.0) -> None:
    """Flush what can be flushed within `timeout_s` and stop exporting (a dead collector never holds it up)."""
    global ACTIVE
    provider = _state.get("provider")
    if not ACTIVE or provider is None:
        return
    ACTIVE = False
    thread = threading.Thread(target=provider.shutdown, name="trace-shutdown", daemon=True)
    thread.start()
    thread.join(timeout_s)


def _dropped(n: int) -> None:
    """Count `n` spans dropped (a full queue or a failed export); warn at most once a minute."""
    _state["dropped"] = _state.get("dropped", 0) + n
    on_drop = _state.get("on_drop")
    if on_drop is not None:
        on_drop(n)
    now = time.monotonic()
    if now - _state.get("warned_at", -WARN_EVERY_S) >= WARN_EVERY_S:
        _state["warned_at"] = now
        log.warning(
            "tracing: %d spans dropped so far (collector %s down, slow or refusing); predictions go on",
            _state["dropped"],
            _state.get("endpoint"),
        )


def dropped() -> int:
    """Spans dropped since setup."""
    return int(_state.get("dropped", 0))


# --- the request path (called only when ACTIVE) ------------------------------------------------------------


def begin(name: str, traceparent: str | bytes | None, entrypoint: str) -> tuple[Any, Any, bytes]:
    """Start a request's span under the caller's `traceparent` (malformed or absent: a new trace).

    Returns (span, token for end(), the traceparent to answer with). An unsampled request, most of them,
    gets span and token None: its only cost is the sampling decision and the traceparent answered
    (serving/observability/spans/sdk.py, `request_starter`), and it records no children. A sampled
    span is made the current one. `entrypoint`: "REST" or "GRPC".
    """
    if isinstance(traceparent, str):
        traceparent = traceparent.encode("latin-1")
    return (_begin_grpc if entrypoint == "GRPC" else _begin_plain_rest)(name, traceparent or b"")


# `begin_rest(name, traceparent, low)`: begin() for the REST router, whose answer is the response header line
# itself (b"\r\ntraceparent: ..."), appended as it is. The router draws `low`, a root's 64 random bits, and
# calls it only for a request that sent a traceparent or a root they sample (`low < ROOT_BOUND`): the others,
# most requests, cost a test and one random number. Set by setup().
begin_rest: Callable[[str, bytes, int], tuple[Any, Any, bytes]]


def end(span: Any, token: Any, error: str | None = None) -> None:
    """End the request's span (started by begin) and restore the current span before it."""
    if span is None:
        return
    _CURRENT.reset(token)
    if error is not None and "ctr.status" not in (span.attributes or {}):  # the predictor's code first
        span.set_attribute("ctr.status", error)
        _state["set_error"](span, error)
    span.end()


# `current()`: the request's span when it is sampled, else None (the context variable's own C method: it
# runs several times a request, sampled or not).
current: Callable[[], Any] = _CURRENT.get


def annotate(span: Any, model: str, version: int, signature: str, rows: int) -> None:
    """The request span's attributes once the version and the batch are known."""
    span.set_attributes(
        {
            "ctr.model.name": model,
            "ctr.model.version": version,
            "ctr.signature": signature,
            "ctr.batch_size": rows,
        }
    )


def status(span: Any, code: str) -> None:
    """The request's outcome: OK or the error's code (INVALID_ARGUMENT, ...)."""
    span.set_attribute("ctr.status", code)
    if code != "OK":
        _state["set_error"](span, code)


# `child(parent, name, start_s, end_s=None, **attributes)`: record a finished child span of `parent` (a span,
# or what child() and batch() return) from perf_counter stamps (end: now); returns its context, to be the
# parent of others. `batch(parents, start_s, end_s, rows)`: the span of one model call, the child of the first
# traced request and linked to each of them. Set by setup() (spans/sdk.py's, queued as plain records).
child: Callable[..., Any]
batch: Callable[[list[Any], float, float, int], Any]
