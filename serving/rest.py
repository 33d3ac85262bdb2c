"""TF Serving's REST API (port 8501) as a bare ASGI app: no framework on the hot path.

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
from collections.abc import Awaitable, Callable
from typing import Any

from serving.errors import (
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServingError,
    Unavailable,
    Unimplemented,
)
from serving.model_info import metadata_json, status_response, to_json
from serving.predictor import Predictor
from serving.rest_codec import encode_predictions, parse_body, to_features

log = logging.getLogger(__name__)

MODEL_ROUTE = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<action>/metadata|:predict|:classify|:regress)?$"
)
JSON_HEADERS = [(b"content-type", b"application/json")]
METRICS_HEADERS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
METRICS_PATHS = ("/monitoring/prometheus/metrics", "/metrics")
DISCARD_FACTOR = 4

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class RestApp:
    """The ASGI application; `predictor` holds the models, `metrics_text` renders the exposition."""

    def __init__(self, predictor: Predictor, max_body_bytes: int, metrics_text: Callable[[], str]) -> None:
        self.predictor, self.manager = predictor, predictor.manager
        self.max_body_bytes, self._metrics_text = max_body_bytes, metrics_text

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan and websocket scopes are not used (uvicorn runs with lifespan="off")
        headers = JSON_HEADERS
        try:
            status, body, headers = await self._dispatch(scope, receive)
        except ServingError as exc:
            status, body = exc.http_status, _error_body(exc.message)
        except Exception as exc:  # a bug, not a client mistake: log it with its traceback, answer 500
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            status, body = 500, _error_body(f"internal error: {type(exc).__name__}: {exc}")
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _dispatch(self, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes, list]:
        path, method = scope["path"], scope["method"]
        route = MODEL_ROUTE.match(path)
        if route is None:
            if path in METRICS_PATHS or path == "/healthz":
                _require(method, "GET")
                if path == "/healthz":
                    return 200, b'{"status": "alive"}', JSON_HEADERS
                return 200, self._metrics_text().encode(), METRICS_HEADERS
            raise NotFound(f"Malformed request: {method} {path}")
        name, label, action = route["name"], route["label"], route["action"]
        version = _parse_version(route["version"])
        if action == ":predict":
            _require(method, "POST")
            return 200, await self._predict(scope, receive, name, version, label), JSON_HEADERS
        if action in (":classify", ":regress"):
            raise Unimplemented(f"{action[1:]} is not served; this model has a predict signature only")
        _require(method, "GET")
        if action == "/metadata":
            lv = self.manager.resolve(name, version, label)
            return (
                200,
                json.dumps(metadata_json(name, lv.version, lv.backend.signature)).encode(),
                JSON_HEADERS,
            )
        return self._status(name, version, label)

    async def _predict(
        self, scope: dict[str, Any], receive: Receive, name: str, version: int | None, label: str | None
    ) -> bytes:
        body = await self._read_body(scope, receive)
        request = None

        def decode(sig: Any) -> Any:
            nonlocal request
            request = parse_body(body)
            return to_features(request, sig)

        scores, _ = await self.predictor.predict(name, version, label, decode, "REST")
        assert request is not None
        return encode_predictions(scores, request.columnar)

    def _status(self, name: str, version: int | None, label: str | None) -> tuple[int, bytes, list]:
        if label is not None:
            version = self.manager.resolve(name, None, label).version
        states = self.manager.status(name, version)
        if self.predictor.draining:
            raise Unavailable("the server is shutting down")
        body = json.dumps(to_json(status_response(states))).encode()
        # Readiness: 503 until some requested version is AVAILABLE (loaded and warmed).
        ready = any(s.state == "AVAILABLE" for s in states)
        return (200 if ready else 503), body, JSON_HEADERS

    async def _read_body(self, scope: dict[str, Any], receive: Receive) -> bytes:
        """The whole body, or PayloadTooLarge once it passes `max_body_bytes`.

        An oversized body is still read (and dropped) up to DISCARD_FACTOR x the limit before answering:
        closing on a client that is still sending resets the connection, and it would never see the 413.
        """
        limit = self.max_body_bytes
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size <= limit:
                chunks.append(chunk)
            elif not more or size > limit * DISCARD_FACTOR:
                declared = dict(scope["headers"]).get(b"content-length", b"")
                got = f"request body of {int(declared)} bytes" if declared.isdigit() else "request body"
                raise PayloadTooLarge(f"{got} is over the limit of {limit} (--max_body_bytes)")
            if not more:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _require(method: str, expected: str) -> None:
    if method != expected:
        raise MethodNotAllowed(f"method {method} is not allowed here; use {expected}")


def _parse_version(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise InvalidArgument(f"version must be a positive integer, got '{text}'")
    return int(text)
