"""TF Serving's REST API (port 8501): routing and handlers, independent of the HTTP transport.

Routes:
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]            status (readiness: 503 until loaded)
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata   signature_def
    GET  /monitoring/prometheus/metrics and /metrics             Prometheus text
    GET  /healthz                                                liveness (200 while the process serves)
Every error is `{"error": "..."}` with the status of its ServingError subclass (serving/errors.py).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ctr_contract.repository import MAX_VERSION, parse_version_dir
from serving.codecs.rest_codec import encode_predictions
from serving.dataplane.model_set import ServedModels
from serving.errors import (
    JSON,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    ServingError,
    Unavailable,
    Unimplemented,
    error_body,
)
from serving.observability.log_limits import RateLimitedLog
from serving.protocols.model_info import metadata_json, status_response, to_json
from serving.protocols.rest_body import BodyDecoder, BodyOverLimits
from serving.requests import DecodedRequest
from serving.signatures import Signature

if TYPE_CHECKING:
    from serving.protocols.v2_rest import V2RestApp

log = logging.getLogger(__name__)
client_log = RateLimitedLog(log)  # lines a client can cause at will: at most a few a minute

MODEL_ROUTE = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<action>/metadata|:predict|:classify|:regress)?$"
)
METRICS_TEXT = b"text/plain; version=0.0.4; charset=utf-8"
METRICS_PATHS = ("/monitoring/prometheus/metrics", "/metrics")


class RestApp:
    """The REST handlers; `models` holds the models (serving/dataplane/model_set.py), `metrics_text` renders the exposition."""

    def __init__(
        self,
        models: ServedModels,
        metrics_text: Callable[[], str],
        decoder: BodyDecoder,
        v2: V2RestApp | None = None,
    ) -> None:
        """`v2`: the Open Inference Protocol routes under /v2 (serving/protocols/v2_rest.py); None: no /v2 routes."""
        self.models, self._metrics_text, self.decoder = models, metrics_text, decoder
        self.v2 = v2

    async def handle(
        self,
        method: str,
        path: str,
        body: bytes | bytearray,
        request_id: str | None = None,
        header_length: int | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Answer one request; never raises. Returns (status, body, content type).

        `request_id`: the id the HTTP layer returns in `x-request-id`; a sampled predict logs it.
        `header_length`: the v2 binary extension's Inference-Header-Content-Length, when sent.
        """
        try:
            if self.v2 is not None and (path == "/v2" or path.startswith("/v2/")):
                return await self.v2.dispatch(method, path, body, header_length, request_id)
            return await self._dispatch(method, path, body, request_id)
        except ServingError as exc:
            return exc.http_status, error_body(exc.message), JSON
        except Exception as exc:  # a bug, not a client mistake: log it with its traceback, answer 500
            client_log.log(
                logging.ERROR, "rest-500", "unhandled error on %s %.200s", method, path, exc_info=True
            )
            return 500, error_body(f"internal error: {type(exc).__name__}: {exc}"), JSON

    async def _dispatch(
        self, method: str, path: str, body: bytes | bytearray, request_id: str | None = None
    ) -> tuple[int, bytes, bytes]:
        route = MODEL_ROUTE.match(path)
        if route is None:
            if path in METRICS_PATHS or path == "/healthz":
                _require(method, "GET")
                if path == "/healthz":
                    return 200, b'{"status": "alive"}', JSON
                return 200, self._metrics_text().encode(), METRICS_TEXT
            raise NotFound(f"Malformed request: {method} {path}")
        name, label, action = route["name"], route["label"], route["action"]
        version = parse_version(route["version"])
        if action == ":predict":
            _require(method, "POST")
            return 200, await self._predict(body, name, version, label, request_id), JSON
        if action in (":classify", ":regress"):
            raise Unimplemented(f"{action[1:]} is not served; this model has a predict signature only")
        _require(method, "GET")
        if action == "/metadata":
            servable = self.models.lookup(name).manager.resolve(name, version, label)
            return (
                200,
                json.dumps(metadata_json(name, servable.version, servable.backend.signature)).encode(),
                JSON,
            )
        return self._status(name, version, label)

    async def _predict(
        self,
        body: bytes | bytearray,
        name: str,
        version: int | None,
        label: str | None,
        request_id: str | None = None,
    ) -> bytes:
        predictor = self.models.lookup(name)
        columnar = False

        async def decode(sig: Signature) -> DecodedRequest:
            nonlocal columnar
            try:
                columnar, request = await self.decoder.decode(body, sig)
            except BodyOverLimits:
                predictor.metrics.requests_refused.inc("instances")
                raise
            return request

        prediction = await predictor.predict(name, version, label, decode, "REST", request_id)
        return encode_predictions(prediction.scores, columnar)

    def _status(self, name: str, version: int | None, label: str | None) -> tuple[int, bytes, bytes]:
        predictor = self.models.lookup(name)
        if label is not None:
            version = predictor.manager.resolve(name, None, label).version
        states = predictor.manager.status(name, version)
        if predictor.draining:
            raise Unavailable("the server is shutting down")
        body = json.dumps(to_json(status_response(states))).encode()
        # Readiness: 503 until some requested version is AVAILABLE (loaded and warmed).
        ready = any(s.state == "AVAILABLE" for s in states)
        return (200 if ready else 503), body, JSON


def _require(method: str, expected: str) -> None:
    if method != expected:
        raise MethodNotAllowed(f"method {method} is not allowed here; use {expected}")


def parse_version(text: str | None) -> int | None:
    if text is None:
        return None
    # The version-folder rule: 1..2**63-1 without leading zeros (and no int() of 5,000 digits).
    version = parse_version_dir(text)
    if version is None:
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        if not (text.isascii() and text.isdigit()):  # int() rejects some Unicode digits, e.g. '²'
            raise InvalidArgument(f"version must be a positive integer, got '{shown}'")
        raise InvalidArgument(
            f"version must be an integer from 1 to {MAX_VERSION} without leading zeros, got '{shown}'"
        )
    return version
