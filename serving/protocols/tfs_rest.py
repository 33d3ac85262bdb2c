"""TF Serving's REST API (port 8501): the /v1/models routes, independent of the HTTP transport.

Routes:
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]            status (readiness: 503 until loaded)
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata   signature_def
The router (serving/protocols/router.py) sends these paths here and renders every ServingError raised as
`{"error": "..."}` with its status (serving/errors.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from functools import lru_cache

from serving.codecs.rest_codec import decode_predict, encode_predictions
from serving.dataplane.model_set import ServedModels
from serving.dataplane.validation import parse_version
from serving.errors import JSON, NotFound, Unavailable, Unimplemented
from serving.http.messages import (
    PATHS_CACHED,
    RequestPath,
    answer_headers,
    model_route,
    request_deadline,
    require_method,
)
from serving.observability import tracing
from serving.protocols.model_info import metadata_json, status_response, to_json
from serving.protocols.rest_body import BOUNDS_MIN_BYTES, BodyDecoder, BodyOverLimits
from serving.requests import DecodedRequest
from serving.signatures import Signature

# (segments after /v1/models/{name}[/versions/{v}|/labels/{l}], the raw last segment's :verb) -> action
V1_ACTIONS: dict[tuple[tuple[str, ...], str | None], str | None] = {
    ((), None): None,
    (("metadata",), None): "/metadata",
    **{((), verb): f":{verb}" for verb in ("predict", "classify", "regress")},
}


@lru_cache(maxsize=PATHS_CACHED)
def v1_target(raw: str) -> tuple[tuple[str, str | None, str | None, tuple[str, ...]] | None, str | None]:
    """A raw /v1 path's (name, version, label, rest) (None: not a model's path) and its `:verb`; cached, as a
    server sees few distinct paths. Split at `/` on the raw path, each segment decoded: `%2F` is in a name."""
    segments, verb = RequestPath(raw).split_verb()
    return model_route(segments, ("v1", "models"), labels=True), verb


@lru_cache(maxsize=PATHS_CACHED)
def v1_predict_target(raw: str) -> tuple[str, str | None, str | None] | None:
    """A raw path's (name, version, label) when it is a /v1 predict (`.../models/{name}[...]:predict`), else
    None: the router hands such a POST straight to `TfsRestApp.predict`. Cached, as `v1_target`."""
    if not raw.startswith("/v1/models/"):
        return None
    route, verb = v1_target(raw)
    if route is None or verb != "predict" or route[3]:
        return None
    return route[0], route[1], route[2]


@lru_cache(maxsize=64)
def _answer_type(version: int, fallback: str | None) -> bytes:
    """A predict answer's content type and the header lines after it (the answering version, the fallback's
    reason): the same few for every answer, made once."""
    return JSON + answer_headers(version, fallback)


class TfsRestApp:
    """The /v1/models handlers over the served models (serving/dataplane/model_set.py)."""

    def __init__(self, models: ServedModels, decoder: BodyDecoder) -> None:
        """`decoder`: parses a large predict body in its child process (serving/protocols/rest_body.py)."""
        self.models, self.decoder = models, decoder
        self._predictors = models.predictors

    async def dispatch(
        self, method: str, path: RequestPath, body: bytes | bytearray, request_id: str | None = None
    ) -> tuple[int, bytes, bytes]:
        """Answer one /v1 request: (status, body, content type); raises ServingError (the router renders it).

        `request_id`: the id the HTTP layer returns in `x-request-id`; a sampled predict logs it.
        """
        route, verb = v1_target(path.raw)
        if route is None or (route[3], verb) not in V1_ACTIONS:
            raise NotFound(f"Malformed request: {method} {path}")
        name, version_text, label, rest = route
        action = V1_ACTIONS[rest, verb]
        if method != ("POST" if action == ":predict" else "GET"):
            if version_text is not None:
                parse_version(version_text)  # a malformed version is a 400 first
            self.models.lookup(name).manager.status(name)  # an unknown model is a 404 before any 405
        if action == ":predict":
            require_method(method, "POST")
            return await self.predict(body, name, version_text, label, request_id)
        version = None if version_text is None else parse_version(version_text)
        if action in (":classify", ":regress"):
            raise Unimplemented(f"{action[1:]} is not served; this model has a predict signature only")
        require_method(method, "GET")
        if action == "/metadata":
            servable = self.models.lookup(name).router.resolve(name, version, label)
            return (
                200,
                json.dumps(metadata_json(name, servable.version, servable.backend.signature)).encode(),
                JSON,
            )
        return self._status(name, version, label)

    async def predict(
        self,
        body: bytes | bytearray,
        name: str,
        version_text: str | None,
        label: str | None,
        request_id: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        """One predict POST's (200, answer, content type with `x-model-version` and `x-ctr-fallback`);
        raises ServingError. `version_text`: the path's version segment (None: none named)."""
        version = None if version_text is None else parse_version(version_text)
        # The served models' own dict, changed in place (ServedModels.lookup: the answer for a name not in it).
        predictor = self._predictors.get(name) or self.models.lookup(name)
        columnar = False

        def decode(sig: Signature) -> DecodedRequest | Awaitable[DecodedRequest]:
            nonlocal columnar
            if len(body) <= BOUNDS_MIN_BYTES:  # nothing to bound, decoded inline: the codec itself, no await
                columnar, request = decode_predict(body, sig)
                return request

            async def bounded() -> DecodedRequest:  # a large body: bounded, in the decoder's child process
                nonlocal columnar
                try:
                    columnar, request = await self.decoder.decode(body, sig)
                except BodyOverLimits:
                    predictor.metrics.requests_refused.inc("instances")
                    raise
                return request

            return bounded()

        prediction = await predictor.predict(
            name, version, label, decode, "REST", request_id, deadline=request_deadline()
        )
        span = tracing.current() if tracing.ACTIVE else None
        started = time.perf_counter() if span is not None else 0.0
        # `ctr` alone, whatever the version serves (docs/decisions/0007-v1-rest-answers-ctr.md).
        answer = encode_predictions(prediction.ctr, columnar)
        if span is not None:
            tracing.child(span, "encode", started)
        return 200, answer, _answer_type(prediction.servable.version, prediction.fallback)

    def _status(self, name: str, version: int | None, label: str | None) -> tuple[int, bytes, bytes]:
        predictor = self.models.lookup(name)
        if label is not None:
            version = predictor.router.resolve(name, None, label).version
        states = predictor.manager.status(name, version)
        if predictor.draining:
            raise Unavailable("the server is shutting down")
        body = json.dumps(to_json(status_response(states))).encode()
        # Readiness: 503 until some requested version is AVAILABLE (loaded and warmed).
        ready = any(s.state == "AVAILABLE" for s in states)
        return (200 if ready else 503), body, JSON
