"""The one router: each REST path to its protocol's handlers, and every gRPC service onto one server.

REST (the HTTP layer hands each request to `RestRouter.handle`, with its raw path):
    /v2, /v2/, /v2/...                             Open Inference Protocol v2 (serving/protocols/v2_rest.py)
    /v1/models/...                                 TF Serving's REST API (serving/protocols/tfs_rest.py)
    GET  /monitoring/prometheus/metrics, /metrics  Prometheus text
    GET  /healthz                                  liveness (200 while the process serves)
Routes are matched on the raw path split at `/`, each segment decoded after the split (`RequestPath`,
serving/http/messages.py): `%2F` is part of a name, never a separator. Every error is `{"error": "..."}` with
the status of its ServingError subclass (serving/errors.py); a 405 also names the methods in `Allow`.

gRPC: TF Serving's PredictionService and ModelService (serving/protocols/tfs_grpc.py) and v2's
GRPCInferenceService (serving/protocols/v2_grpc.py), on one grpc.aio server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from random import getrandbits

import grpc

from ctr_contract.ratelog import RateLimitedLog
from serving.dataplane.model_set import ServedModels
from serving.errors import JSON, MethodNotAllowed, ServingError, error_body
from serving.http.messages import TRACEPARENT, RequestPath, require_method
from serving.observability import tracing
from serving.protocols.rest_body import BodyDecoder
from serving.protocols.tfs_grpc import tfs_handlers
from serving.protocols.tfs_rest import TfsRestApp, v1_predict_target
from serving.protocols.v2_grpc import v2_handler
from serving.protocols.v2_models import V2Models
from serving.protocols.v2_rest import V2RestApp

log = logging.getLogger(__name__)
client_log = RateLimitedLog(log)  # lines a client can cause at will: at most a few a minute

METRICS_TEXT = b"text/plain; version=0.0.4; charset=utf-8"
METRICS_PATHS = (("monitoring", "prometheus", "metrics"), ("metrics",))
V2_ROOT = ("v2",)


class RestRouter:
    """The application behind the HTTP layer (serving/http/shared.py's RequestHandler)."""

    def __init__(self, models: ServedModels, decoder: BodyDecoder, metrics_text: Callable[[], str]) -> None:
        """`decoder` parses large bodies in its child process; `metrics_text` renders the Prometheus page."""
        self.v1 = TfsRestApp(models, decoder)
        self.v2 = V2RestApp(V2Models(models.current), decoder)
        self._metrics_text = metrics_text

    async def handle(
        self,
        method: str,
        path: str,
        body: bytes | bytearray,
        request_id: str | None = None,
        header_length: int | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Answer one request; never raises. Returns (status, body, content type).

        `path`: the raw path as sent, percent-escapes untouched (its bytes as latin-1), without the query.

        `request_id`: the id the HTTP layer returns in `x-request-id`; a sampled predict logs it.
        `header_length`: the v2 binary extension's Inference-Header-Content-Length, when sent.
        With tracing on, every POST runs in its span, under the client's traceparent, which the answer
        returns; the span is begun and ended here, in this coroutine (another around it would cost every
        request, sampled or not, more than the sampling decision does). The decision of a request without a
        traceparent is one random number, drawn here (tracing.ROOT_BOUND).
        """
        span = token = answer = None
        if tracing.ACTIVE and method == "POST":
            traceparent, low = TRACEPARENT.get(), getrandbits(64)  # a root's decision: most go no further
            if traceparent or low < tracing.ROOT_BOUND:
                name = "infer" if path.startswith("/v2") else "predict"
                span, token, answer = tracing.begin_rest(name, traceparent, low)
        try:
            predict = v1_predict_target(path) if method == "POST" else None
            if predict is not None:  # TF Serving's predict, the hot path: straight to it
                answered = await self.v1.predict(body, *predict, request_id)
            else:
                answered = await self._dispatch(method, path, body, request_id, header_length)
        except MethodNotAllowed as exc:
            answered = 405, error_body(exc.message), JSON + b"\r\nallow: " + exc.allow.encode()
        except ServingError as exc:
            answered = exc.http_status, error_body(exc.message), JSON
        except Exception as exc:  # a bug, not a client mistake: log it with its traceback, answer 500
            client_log.log(
                logging.ERROR, "rest-500", "unhandled error on %s %.200s", method, path, exc_info=True
            )
            answered = 500, error_body(f"internal error: {type(exc).__name__}: {exc}"), JSON
        except BaseException:  # cancelled (the connection went): the span ends all the same
            tracing.end(span, token, "500")
            raise
        if not answer:  # tracing off, or an unsampled request that sent no traceparent
            return answered
        status, out, content_type = answered
        if span is not None:
            span.set_attribute("http.response.status_code", status)
            tracing.end(span, token, None if status < 400 else str(status))
        return status, out, content_type + answer  # answer: the traceparent header line

    async def _dispatch(
        self,
        method: str,
        path: str,
        body: bytes | bytearray,
        request_id: str | None,
        header_length: int | None,
    ) -> tuple[int, bytes, bytes]:
        """Every request but a /v1 predict POST: to its protocol by the path's decoded segments."""
        route = RequestPath(path)
        segments = route.segments
        if segments[:1] == V2_ROOT:
            if segments == ("v2", ""):  # the protocol's own path for the server metadata
                route.segments = V2_ROOT
            return await self.v2.dispatch(method, route, body, header_length, request_id)
        if segments in METRICS_PATHS or segments == ("healthz",):
            require_method(method, "GET")
            if segments == ("healthz",):
                return 200, b'{"status": "alive"}', JSON
            return 200, self._metrics_text().encode(), METRICS_TEXT
        return await self.v1.dispatch(method, route, body, request_id)


def build_grpc_server(
    models: ServedModels,
    host: str,
    port: int,
    max_message_bytes: int,
    reuse_port: bool = False,
    credentials: grpc.ServerCredentials | None = None,
) -> grpc.aio.Server:
    """A grpc.aio server bound to host:port with TF Serving's and v2's services registered (not started yet).

    `reuse_port`: share the port with the other workers of `--num_workers N` (SO_REUSEPORT); otherwise a port
    already in use must fail, not be silently shared. `credentials`: TLS (serving/app/tls.py); None: plaintext.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", int(reuse_port)),
        ]
    )
    server.add_generic_rpc_handlers((*tfs_handlers(models), v2_handler(V2Models(models.current))))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
    except RuntimeError as exc:  # grpcio raises RuntimeError("Failed to bind ...") on a busy port
        raise OSError(f"cannot bind gRPC to {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {address}")
    return server
