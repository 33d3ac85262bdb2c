"""One process serving REST (serving/http/server.py) and gRPC (grpc.aio) on one event loop (uvloop).

Lifecycle: bind both ports, load the model in the background (readiness is 503 meanwhile), poll for
new versions; on SIGTERM/SIGINT stop being ready, refuse new predicts, let in-flight ones finish within
`--grace_period_seconds`, close both servers and return (exit code 0).

As one of the workers of `--num_workers N` (serving/app/workers.py) it differs in three ways: it joins the
shared ports with SO_REUSEPORT only after its first model scan (so the kernel sends a starting or restarted
worker no connection before it can answer), its metrics go to the run's shared files
(serving/observability/metrics_shared.py), and it stops by itself if the parent process is gone.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc

from ctr_contract.traffic import TrafficSplit
from serving.app.config import ServerConfig
from serving.app.curl_example import curl_example
from serving.app.tls import load_tls_config
from serving.codecs import raw_body
from serving.dataplane.model_set import ModelSet, ServedModels
from serving.dataplane.predictor import Predictor
from serving.dataplane.validation import Limits
from serving.http.server import HttpLimits, HttpServer
from serving.observability import tracing
from serving.observability.drift import DriftMonitor
from serving.observability.metrics import ServingMetrics
from serving.observability.metrics_shared import SharedServingMetrics
from serving.observability.request_log import RequestLog
from serving.protocols.grpc_health import HealthReporter
from serving.protocols.rest_body import BodyDecoder
from serving.protocols.router import RestRouter, build_grpc_server
from serving.repository.manager import ModelManager
from serving.repository.model_config import ModelConfigError, ModelConfigPoller, ModelSpec, read_model_config
from serving.routing.router import Router
from serving.runtime.backends import Backend, import_runtime
from serving.runtime.servable import BatchingOptions, Runner, build_runners

log = logging.getLogger(__name__)
GC_YOUNG_THRESHOLD = 20_000
Watchers = tuple[DriftMonitor | None, RequestLog | None]  # what watches one model's answers (None: off)
PARENT_CHECK_S = 0.25  # how often a worker publishes its in-flight gauge and checks that its parent lives


@dataclass(frozen=True)
class WorkerRole:
    """What a worker of `--num_workers N` gets from its parent (serving/app/workers.py)."""

    index: int  # 0..N-1; worker 0 prints the curl example
    parent_pid: int
    metrics_dir: Path  # the run's shared metrics files


def _runner_factory(
    cfg: ServerConfig, metrics: ServingMetrics, executor: ThreadPoolExecutor, model_name: str
) -> Callable[[Backend, int, DriftMonitor | None], dict[str, Runner]]:
    """Each loaded version's runner per signature, sharing the inference thread, telling drift of batches."""
    batching = None
    if cfg.enable_batching:
        batching = BatchingOptions(
            max_batch_size=cfg.max_batch_size,
            batch_timeout_s=cfg.batch_timeout_micros / 1e6,
            max_enqueued_batches=cfg.max_enqueued_batches,
            timeout_s=cfg.rest_api_timeout_in_ms / 1e3 or float("inf"),  # 0: no deadline
        )
    return lambda backend, version, drift: build_runners(
        backend, batching, executor, metrics, model_name, version, drift, cfg.model_statistics
    )


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host is an IPv6 address).

    `reuse_port`: share the port with the other workers (SO_REUSEPORT); otherwise a port in use fails.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind REST to {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def _open_ports(
    cfg: ServerConfig,
    models: ServedModels,
    metrics: ServingMetrics,
    decoder: BodyDecoder,
    reuse_port: bool,
    health: HealthReporter,
) -> tuple[grpc.aio.Server, HttpServer | None]:
    """Bind both ports before serving anything (a busy port fails the process, exit 1), then serve them."""
    rest_socket = _bind(cfg.host, cfg.rest_api_port, reuse_port) if cfg.rest_api_port else None
    tls = load_tls_config(cfg.ssl_config_file) if cfg.ssl_config_file is not None else None
    grpc_server = build_grpc_server(
        models,
        cfg.host,
        cfg.port,
        cfg.max_body_bytes,
        reuse_port,
        tls.grpc_credentials() if tls is not None else None,
    )
    health.register(grpc_server)
    await health.refresh()  # grpcio-health-checking starts at SERVING: not before a model is
    await grpc_server.start()
    log.info("gRPC listening on %s:%d%s", cfg.host, cfg.port, " (TLS)" if tls else "")
    http_server = None
    if rest_socket is not None:
        # Workers name themselves in each response, so a client can tell which one answered.
        served_by = b"x-served-by-pid: %d\r\n" % os.getpid() if reuse_port else b""
        decoder.start()
        app = RestRouter(models, decoder, lambda: metrics.render() + models.drift_text())
        http_server = HttpServer(app, http_limits(cfg), metrics, served_by)
        await http_server.start(rest_socket, tls.ssl_context() if tls is not None else None)
        log.info("REST listening on %s:%d%s", cfg.host, cfg.rest_api_port, " (TLS)" if tls else "")
    return grpc_server, http_server


def http_limits(cfg: ServerConfig) -> HttpLimits:
    """The REST connection limits of `cfg`."""
    return HttpLimits(
        max_body_bytes=cfg.max_body_bytes,
        header_timeout_s=cfg.header_timeout_seconds,
        body_timeout_s=cfg.body_timeout_seconds,
        keepalive_timeout_s=cfg.keepalive_timeout_seconds,
        max_header_bytes=cfg.max_header_bytes,
        max_headers=cfg.max_headers,
        max_connections=cfg.max_connections,
        max_output_bytes=cfg.max_output_bytes,
        max_buffered_bytes=cfg.max_buffered_bytes,
        compress_min_bytes=cfg.response_compression_min_bytes,
        make_request_ids=cfg.request_log_sample_rate > 0 and cfg.request_log_dir is not None,
        request_log_rate=cfg.request_log_sample_rate,
    )


async def _worker_chores(worker: WorkerRole, metrics: SharedServingMetrics, stop: asyncio.Event) -> None:
    """Publish the in-flight gauge for the other workers' scrapes; stop when the parent is gone."""
    while not stop.is_set():
        metrics.publish()
        if os.getppid() != worker.parent_pid:
            log.error("parent process %d is gone; this worker stops", worker.parent_pid)
            stop.set()
        await asyncio.sleep(PARENT_CHECK_S)


def model_builder(
    cfg: ServerConfig,
    metrics: ServingMetrics,
    run_executor: ThreadPoolExecutor,
    disk_executor: ThreadPoolExecutor,
) -> Callable[[ModelSpec, Callable[[ModelManager], Watchers]], Predictor]:
    """How the server makes each model: `build(spec, watch)` (tests/serving/test_request_walk.py makes one too)."""
    limits = Limits(cfg.max_instances, cfg.allow_nonfinite)
    fallback = cfg.fallback_options()

    def build(spec: ModelSpec, watch: Callable[[ModelManager], Watchers]) -> Predictor:
        """One model's router, version manager and predictor, each complete when made; all share the metrics,
        the limits and the threads. `watch`: the drift monitor and request log of the model's answers."""
        metrics.start_at_zero(spec.name)  # each model's alerted counters exist at 0 from its start
        runners = _runner_factory(cfg, metrics, run_executor, spec.name)
        router = Router(
            spec.name,
            spec.labels,
            metrics,
            spec.traffic,  # the model's ctr-traffic line in --model_config_file; None: the flags' shares
            default_traffic=TrafficSplit(cfg.canary_percent, cfg.shadow_percent),
            fallback=fallback,
        )
        manager = ModelManager(
            spec.name,
            spec.base_path,
            cfg.backend,
            cfg.intra_op_threads,
            spec.policy,
            metrics,
            disk_executor,
            router,
            # `drift` is bound below (it reads the manager's newest version); nothing loads before `build` returns
            make_runners=lambda backend, version: runners(backend, version, drift),
            manifest_wait_s=cfg.manifest_wait_timeout_seconds,
            load_timeout_s=cfg.model_load_timeout_seconds,
            cache_root=cfg.model_cache_dir,
            download_timeout_s=cfg.model_download_timeout_seconds,
        )
        drift, request_log = watch(manager)
        return Predictor(manager, router, limits, metrics, drift, request_log, cfg.model_statistics)

    return build


async def serve(cfg: ServerConfig, worker: WorkerRole | None = None) -> None:
    """Run the server until SIGTERM/SIGINT, then drain and return; `worker`: as one of N workers."""
    loop = asyncio.get_running_loop()
    metrics = ServingMetrics() if worker is None else SharedServingMetrics(worker.metrics_dir)
    # In each worker: the exporter's thread belongs to its process; its drops are counted on the event loop (the
    # shared counters' files are written from one thread), in the counter every worker's page merges.
    tracing.setup(
        cfg.tracing_config,
        on_drop=lambda n: loop.call_soon_threadsafe(partial(metrics.trace_spans_dropped.inc, amount=n)),
    )
    # One thread runs model batches (ORT has its own intra-op threads); another scans the version folders, so
    # a slow disk never delays inference. Each model loads its versions on a thread of its own (serving/repository/loading.py).
    run_executor = ThreadPoolExecutor(1, thread_name_prefix="inference")
    disk_executor = ThreadPoolExecutor(1, thread_name_prefix="version-scan")
    build = model_builder(cfg, metrics, run_executor, disk_executor)
    models = _served_models(cfg, build, metrics, worker)
    decoder = BodyDecoder(cfg.max_instances)  # started with the REST port (a child process for large bodies)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    grpc_server: grpc.aio.Server | None = None
    http_server: HttpServer | None = None
    health = HealthReporter(models.current)
    if worker is None:
        grpc_server, http_server = await _open_ports(cfg, models, metrics, decoder, False, health)

    # Objects alive now (modules, the runtime) live as long as the process: keep the cyclic GC from
    # rescanning them on every collection, which showed as p99 latency spikes under load. Not the versions:
    # a frozen object is never collected, and every version is unloaded some day (serving/repository/reclaim.py).
    await loop.run_in_executor(disk_executor, import_runtime, cfg.backend, cfg.intra_op_threads)
    gc.collect()
    gc.freeze()
    # The young generation is collected every GC_YOUNG_THRESHOLD allocations instead of 700: under load each
    # request in flight holds a few dozen young objects (its task, coroutines, futures), so at 700 every
    # collection walked the same in-flight objects again. Measured in process, 64 connections of single raw
    # rows: 23.3 -> 22.2 µs of CPU a request. Cyclic garbage waits at most that many allocations more.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    await _first_scan(cfg, models)
    chores = None
    if worker is not None and not stop.is_set():
        grpc_server, http_server = await _open_ports(cfg, models, metrics, decoder, True, health)
        assert isinstance(metrics, SharedServingMetrics)
        chores = asyncio.create_task(_worker_chores(worker, metrics, stop))
    latest = models.lookup(cfg.model_name).manager.latest if not isinstance(models, ModelSet) else None
    if cfg.print_curl_example and latest is not None and (worker is None or worker.index == 0):
        base = models.lookup(cfg.model_name).manager.base_path  # a bucket's: its cache folder
        print(curl_example(cfg, base / str(latest.version), latest), flush=True)
    del latest  # this frame lives as long as the server: it must not keep the first version after its unload
    health_task = asyncio.create_task(health.run())
    pollers = _start_polling(cfg, models, metrics)

    await stop.wait()
    log.info("shutting down: readiness off, draining %d in-flight requests", models.inflight)
    health_task.cancel()
    await health.shut_down()
    if not await models.drain(cfg.grace_period_seconds):
        log.warning(
            "grace period of %.1fs ended with %d requests in flight",
            cfg.grace_period_seconds,
            models.inflight,
        )
    for task in (*pollers, chores):
        if task is not None:
            task.cancel()
    if isinstance(models, ModelSet):
        models.stop()
    if http_server is not None:
        await http_server.close(timeout_s=1.0)
    decoder.close()
    if grpc_server is not None:
        await grpc_server.stop(grace=1.0)
    run_executor.shutdown(wait=False, cancel_futures=True)
    disk_executor.shutdown(wait=False, cancel_futures=True)
    for predictor in models.current().values():
        if predictor.request_log is not None:
            predictor.request_log.stop()
    tracing.shutdown()
    log.info("stopped")


def _served_models(
    cfg: ServerConfig,
    build: Callable[[ModelSpec, Callable[[ModelManager], Watchers]], Predictor],
    metrics: ServingMetrics,
    worker: WorkerRole | None,
) -> ServedModels:
    """`--model_name` + `--model_base_path`: one model with drift and request log; or the config file's models,
    each with its own request log folder."""
    if cfg.model_base_path is not None:
        spec = ModelSpec(cfg.model_name, cfg.model_base_path, cfg.model_version_policy, cfg.version_labels)
        return ServedModels.one(build(spec, partial(_watch_traffic, cfg, metrics, worker)))
    log.info("drift metrics are off with --model_config_file (they watch a single --model_base_path)")
    logs: dict[str, RequestLog] = {}  # one per model name, kept when a model leaves the config and comes back

    def logged(spec: ModelSpec, manager: ModelManager) -> Watchers:
        """The model's request log, into DIR/<model name>/ with `--request_log_sample_rate`; no drift."""
        if cfg.request_log_sample_rate <= 0 or cfg.request_log_dir is None:
            return None, None
        if spec.name not in logs:
            folder = spec.name if spec.name.strip(".") else spec.name.replace(".", "%2E")
            logs[spec.name] = _request_log(cfg, metrics, spec.name, cfg.request_log_dir / folder)
        return None, logs[spec.name]

    return ModelSet(lambda spec: build(spec, partial(logged, spec)), cfg.file_system_poll_wait_seconds)


async def _first_scan(cfg: ServerConfig, models: ServedModels) -> None:
    """Load what is there before polling starts; a failure leaves the server live and polling."""
    if isinstance(models, ModelSet):
        assert cfg.model_config_file is not None
        try:
            await models.apply(read_model_config(cfg.model_config_file))
        except ModelConfigError as exc:  # it parsed at start: it was edited since; the poller retries it
            log.error("%s; serving no model until it is fixed", exc)
        return
    try:
        await models.lookup(cfg.model_name).manager.poll_once()
    except Exception:  # e.g. an unreadable base path: keep serving liveness and retry on the next poll
        log.exception("first scan of %s failed", cfg.model_base_path)


def _start_polling(
    cfg: ServerConfig, models: ServedModels, metrics: ServingMetrics
) -> list[asyncio.Task[None]]:
    """Version polling of the one model (the ModelSet polls each of its own), and config-file polling."""
    if isinstance(models, ModelSet):
        if cfg.model_config_file is None or cfg.model_config_file_poll_wait_seconds <= 0:
            return []
        poller = ModelConfigPoller(cfg.model_config_file, models.apply, metrics.model_config_polls.inc)
        return [asyncio.create_task(poller.poll_forever(cfg.model_config_file_poll_wait_seconds))]
    if cfg.file_system_poll_wait_seconds <= 0:
        return []
    manager = models.lookup(cfg.model_name).manager
    return [asyncio.create_task(manager.poll_forever(cfg.file_system_poll_wait_seconds))]


def _watch_traffic(
    cfg: ServerConfig, metrics: ServingMetrics, worker: WorkerRole | None, manager: ModelManager
) -> Watchers:
    """The drift window and the sampled request log (docs/daily-loop.md), when the flags ask for them."""
    drift = request_log = None
    if cfg.drift_window:

        def newest_dir() -> Path | None:
            latest = manager.latest  # the folder it was loaded from (a bucket's: in the cache)
            return None if latest is None else manager.base_path / str(latest.version)

        shared = worker.metrics_dir if worker is not None else None
        drift = DriftMonitor(cfg.model_name, cfg.drift_window, newest_dir, shared, cfg.num_workers)
    if cfg.request_log_sample_rate > 0 and cfg.request_log_dir is not None:
        request_log = _request_log(cfg, metrics, cfg.model_name, cfg.request_log_dir)
    return drift, request_log


def _request_log(cfg: ServerConfig, metrics: ServingMetrics, name: str, directory: Path) -> RequestLog:
    """Model `name`'s sampled request log, writing into `directory`, started (its counters exist at 0)."""
    for counter in (metrics.request_log_lines, metrics.request_log_dropped):
        counter.inc(name, amount=0)  # present from the start: alerts see 0, not no data
    request_log = RequestLog(
        directory,
        cfg.request_log_sample_rate,
        cfg.request_log_max_bytes,
        on_drop=lambda n: metrics.request_log_dropped.inc(name, amount=n),
        on_write=lambda n: metrics.request_log_lines.inc(name, amount=n),
    )
    request_log.start()
    return request_log


def run_server(cfg: ServerConfig, worker: WorkerRole | None = None) -> int:
    """Run `serve` on uvloop (asyncio's own loop where uvloop is missing); returns the exit code."""
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # uvloop is not built for Windows; asyncio's loop works, only slower
        log.warning("uvloop not installed; using the default asyncio loop")
        loop_factory = None
    if not raw_body.NATIVE:  # serves alike, only raw ranking requests decode slower
        log.warning(
            "the native raw-body scan is not built (pip install -e . builds it): raw rows decode through the exact path alone"
        )
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(cfg, worker))
    except OSError as exc:  # a port in use, or an address that is not ours
        log.error("%s", exc)
        return 1
    return 0
