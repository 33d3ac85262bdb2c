"""One process serving REST (serving/http_server.py) and gRPC (grpc.aio) on one event loop (uvloop).

Lifecycle: bind both ports, load the model in the background (readiness is 503 meanwhile), poll for
new versions; on SIGTERM/SIGINT stop being ready, refuse new predicts, let in-flight ones finish within
`--grace_period_seconds`, close both servers and return (exit code 0).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from serving.batching import DynamicBatcher
from serving.config import ServerConfig
from serving.curl_example import curl_example
from serving.grpc_service import build_grpc_server
from serving.http_server import HttpServer
from serving.metrics import ServingMetrics
from serving.predictor import Predictor
from serving.rest import RestApp
from serving.validation import Limits
from serving.versions import LoadedVersion, ModelManager

log = logging.getLogger(__name__)


def _batcher_factory(
    cfg: ServerConfig, metrics: ServingMetrics, executor: ThreadPoolExecutor
) -> Callable[[LoadedVersion], DynamicBatcher]:
    """One DynamicBatcher per loaded version, all sharing the inference thread."""

    def make(lv: LoadedVersion) -> DynamicBatcher:
        return DynamicBatcher(
            lv.backend.predict,
            max_batch_size=cfg.max_batch_size,
            batch_timeout_s=cfg.batch_timeout_micros / 1e6,
            max_enqueued_batches=cfg.max_enqueued_batches,
            timeout_s=cfg.rest_api_timeout_in_ms / 1e3,
            executor=executor,
            metrics=metrics,
            model_name=cfg.model_name,
            runtime=lv.backend.runtime,
        )

    return make


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind REST to {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def serve(cfg: ServerConfig) -> None:
    """Run the server until SIGTERM/SIGINT, then drain and return."""
    loop = asyncio.get_running_loop()
    metrics = ServingMetrics()
    # One thread runs model batches (ORT has its own intra-op threads); another loads new versions so a
    # slow load never delays inference.
    run_executor = ThreadPoolExecutor(1, thread_name_prefix="inference")
    load_executor = ThreadPoolExecutor(1, thread_name_prefix="model-load")
    manager = ModelManager(
        cfg.model_name,
        cfg.model_base_path,
        cfg.backend,
        cfg.intra_op_threads,
        cfg.model_version_policy,
        cfg.version_labels,
        metrics,
        load_executor,
        make_batcher=_batcher_factory(cfg, metrics, run_executor) if cfg.enable_batching else None,
    )
    predictor = Predictor(manager, Limits(cfg.max_instances, cfg.allow_nonfinite), metrics, run_executor)
    # Bind both ports before serving anything: a busy port fails the process (exit 1) with a clear error.
    rest_socket = _bind(cfg.host, cfg.rest_api_port) if cfg.rest_api_port else None
    grpc_server = build_grpc_server(predictor, cfg.host, cfg.port, cfg.max_body_bytes)
    await grpc_server.start()
    log.info("gRPC listening on %s:%d", cfg.host, cfg.port)
    http_server = None
    if rest_socket is not None:
        http_server = HttpServer(RestApp(predictor, metrics.render), cfg.max_body_bytes)
        await http_server.start(rest_socket)
        log.info("REST listening on %s:%d", cfg.host, cfg.rest_api_port)

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    try:
        await manager.poll_once()
    except Exception:  # e.g. an unreadable base path: keep serving liveness and retry on the next poll
        log.exception("first scan of %s failed", cfg.model_base_path)
    # Objects alive now (modules, the model) live as long as the process: keep the cyclic GC from
    # rescanning them on every collection, which showed as multi-ms p99 spikes under load.
    gc.collect()
    gc.freeze()
    if cfg.print_curl_example and manager.latest is not None:
        print(curl_example(cfg, manager.latest), flush=True)
    poller = None
    if cfg.file_system_poll_wait_seconds > 0:
        poller = asyncio.create_task(manager.poll_forever(cfg.file_system_poll_wait_seconds))

    await stop.wait()
    log.info("shutting down: readiness off, draining %d in-flight requests", predictor.inflight)
    if not await predictor.drain(cfg.grace_period_seconds):
        log.warning(
            "grace period of %.1fs ended with %d requests in flight",
            cfg.grace_period_seconds,
            predictor.inflight,
        )
    if poller is not None:
        poller.cancel()
    if http_server is not None:
        await http_server.close(timeout_s=1.0)
    await grpc_server.stop(grace=1.0)
    run_executor.shutdown(wait=False, cancel_futures=True)
    load_executor.shutdown(wait=False, cancel_futures=True)
    log.info("stopped")
