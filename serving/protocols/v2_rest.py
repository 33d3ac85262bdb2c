"""Open Inference Protocol v2 over REST (KServe/Triton), on the REST port beside TF Serving's v1 routes.

Routes:
    GET  /v2                                          server metadata
    GET  /v2/health/live, /v2/health/ready            liveness; readiness (every model has an available version)
    GET  /v2/models/{m}[/versions/{v}]                model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready          model readiness (200 or 503)
    POST /v2/models/{m}[/versions/{v}]/infer          inference: JSON, or the binary tensor extension
    GET  /v2/models/{m}[/versions/{v}]/config         Triton's model_configuration extension
    GET  /v2/models[/{m}[/versions/{v}]]/stats        Triton's statistics extension
    POST /v2/repository/index                         Triton's model_repository extension (read-only)
    POST /v2/repository/models/{m}/load, /unload      400: models come from --model_config_file
Every string of the JSON header is checked as UTF-8 and boolean parameters must be JSON booleans (400).
The router (serving/protocols/router.py) sends /v2 paths here; errors are `{"error": "..."}` with the status of
the ServingError (serving/errors.py), as on v1. Inference goes through the same Predictor as v1 (batching,
limits, metrics, request log, drift).
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import orjson

from serving.codecs.v2_codec import (
    V2Tensor,
    check_header_text,
    check_shape,
    from_bytes,
    from_values,
    to_request,
)
from serving.dataplane.validation import parse_version
from serving.errors import JSON, InvalidArgument, NotFound
from serving.http.messages import (
    RequestPath,
    answer_headers,
    model_route,
    request_deadline,
    require_method,
)
from serving.observability import tracing
from serving.protocols.rest_body import BodyDecoder
from serving.protocols.v2_models import V2Models
from serving.requests import DecodedRequest
from serving.signatures import RAW_SIGNATURE, Signature

V2_ACTIONS = {
    (): None,
    ("ready",): "/ready",
    ("infer",): "/infer",
    ("config",): "/config",  # Triton's model_configuration extension
    ("stats",): "/stats",  # Triton's statistics extension
}  # after /v2/models/{m}[/versions/{v}]
BINARY = b"application/octet-stream"
HEADER_LENGTH = "Inference-Header-Content-Length"


class V2RestApp:
    """The v2 REST handlers over the served models; `handle` answers (status, body, content type)."""

    def __init__(self, models: V2Models, decoder: BodyDecoder) -> None:
        """`decoder`: parses a large body in its child process, as for v1 (serving/protocols/rest_body.py)."""
        self.models, self.decoder = models, decoder

    async def dispatch(
        self,
        method: str,
        path: RequestPath,
        body: bytes | bytearray,
        header_length: int | None,
        request_id: str | None,
    ) -> tuple[int, bytes, bytes]:
        """Answer one /v2 request; raises ServingError (the router renders it).

        `path.segments`: split at `/` on the raw path, each decoded after the split (`%2F` is part of a name).
        """
        segments = path.segments
        if segments in (("v2",), ("v2", "health", "live"), ("v2", "health", "ready")):
            require_method(method, "GET")
            if segments == ("v2",):
                return 200, orjson.dumps(self.models.server_metadata()), JSON
            if segments[-1] == "live":
                return 200, b'{"live": true}', JSON
            ready = self.models.all_ready()
            return (200 if ready else 503), orjson.dumps({"ready": ready}), JSON
        if segments[1:2] == ("repository",) or segments == ("v2", "models", "stats"):
            return self._repository(method, segments, body)
        route = model_route(segments, ("v2", "models"))
        if route is None or route[3] not in V2_ACTIONS:
            raise NotFound(f"Malformed request: {method} {path}")
        name, action = route[0], V2_ACTIONS[route[3]]
        if method != ("POST" if action == "/infer" else "GET"):
            self.models.lookup(name)  # an unknown model is a 404 before any 405
        version = parse_version(route[1])
        if action == "/infer":
            require_method(method, "POST")
            return await self._infer(name, version, body, header_length, request_id)
        require_method(method, "GET")
        if action == "/ready":
            ready = self.models.model_ready(name, version)
            return (200 if ready else 503), orjson.dumps({"name": name, "ready": ready}), JSON
        if action == "/config":
            return 200, orjson.dumps(self.models.model_config(name, version)), JSON
        if action == "/stats":
            return 200, orjson.dumps(self.models.statistics(name, version)), JSON
        return 200, orjson.dumps(self.models.model_metadata(name, version)), JSON

    def _repository(
        self, method: str, segments: tuple[str, ...], body: bytes | bytearray
    ) -> tuple[int, bytes, bytes]:
        """Triton's all-models statistics and model_repository extension: the index, load and unload."""
        if segments == ("v2", "models", "stats"):
            require_method(method, "GET")
            return 200, orjson.dumps(self.models.statistics(None, None)), JSON
        if segments == ("v2", "repository", "index"):
            require_method(method, "POST")
            doc = _loads(bytes(body)) if body.strip() else {}
            if not isinstance(doc, dict):
                raise InvalidArgument(f"the index request must be a JSON object, got {type(doc).__name__}")
            ready = boolean_parameter(doc, "ready", "the index request's 'ready'")
            return 200, orjson.dumps(self.models.repository_index(ready)), JSON
        if (
            len(segments) == 5
            and segments[:3] == ("v2", "repository", "models")
            and segments[4]
            in (
                "load",
                "unload",
            )
        ):
            require_method(method, "POST")
            self.models.load_or_unload(segments[4], segments[3])
        raise NotFound(f"Malformed request: {method} /{'/'.join(segments)}")

    async def _infer(
        self,
        v2_name: str,
        version: int | None,
        body: bytes | bytearray,
        header_length: int | None,
        request_id: str | None,
    ) -> tuple[int, bytes, bytes]:
        predictor, signature = self.models.lookup(v2_name)
        request = await self.decoder.run(parse_infer, body, header_length)
        wanted = _requested_outputs(request)

        async def decode(sig: Signature) -> DecodedRequest:
            if signature == RAW_SIGNATURE and not sig.has_raw:
                raise NotFound(f"model '{v2_name}' is not served: this version has no raw signature")
            sig.requested(wanted, "outputs")
            return to_request(request.tensors, sig, signature)

        prediction = await predictor.predict(
            predictor.manager.name, version, None, decode, "REST", request_id, deadline=request_deadline()
        )
        scores, servable = prediction.scores, prediction.servable
        binary_default = boolean_parameter(request.parameters, "binary_data_output", "parameters")
        sig = servable.backend.signature
        # Every output unless `outputs` names some, in the order it names them.
        answered = [
            (name, sig.output(scores, name), wanted.get(name, binary_default))
            for name in sig.requested(wanted, "outputs")
        ]
        started = time.perf_counter()
        status, out, content_type = encode_response(v2_name, servable.version, request.id, answered)
        span = tracing.current() if tracing.ACTIVE else None
        if span is not None:
            tracing.child(span, "encode", started)
        return status, out, content_type + answer_headers(servable.version, prediction.fallback)


class InferRequest:
    """A parsed v2 inference request: its tensors, id, parameters and requested outputs."""

    def __init__(self, doc: dict[str, Any], tensors: list[V2Tensor]) -> None:
        self.id = doc.get("id")
        self.parameters: dict[str, Any] = doc.get("parameters") or {}
        self.outputs: list[dict[str, Any]] = doc.get("outputs") or []
        self.tensors = tensors


def parse_infer(body: bytes | bytearray, header_length: int | None) -> InferRequest:
    """The JSON header (and the binary tensors after it) of an infer body; 400 naming what is wrong."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise InvalidArgument(
            f"{HEADER_LENGTH} must be the JSON header's length in bytes, at most the body's {len(body)} bytes"
        )
    head = body if header_length is None else memoryview(body)[:header_length]
    binary = b"" if header_length is None else memoryview(body)[header_length:]
    doc = _loads(bytes(head))
    if not isinstance(doc, dict):
        raise InvalidArgument(f"the body must be a JSON object, got {type(doc).__name__}")
    if "id" in doc and not isinstance(doc["id"], str):
        raise InvalidArgument(f"'id' must be a string, got {type(doc['id']).__name__}")
    check_header_text(doc)  # every string it may echo is UTF-8, before any is used
    for key in ("parameters",):
        if key in doc and not isinstance(doc[key], dict):
            raise InvalidArgument(f"'{key}' must be an object, got {type(doc[key]).__name__}")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidArgument("the body needs 'inputs': a non-empty list of {name, datatype, shape, data}")
    tensors, offset = [], 0
    for i, item in enumerate(inputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgument(f"inputs[{i}] must be an object with a string 'name'")
        name, datatype = item["name"], item.get("datatype")
        _check_parameters(item, f"input '{name}'")
        if not isinstance(datatype, str):
            raise InvalidArgument(f"input '{name}' needs a string 'datatype' such as \"FP32\"")
        shape = check_shape(name, item.get("shape"))
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if header_length is None:
                raise InvalidArgument(
                    f"input '{name}' has binary_data_size but the request has no {HEADER_LENGTH} header; "
                    "send the JSON header's length in it"
                )
            if type(size) is not int or size < 0 or offset + size > len(binary):
                raise InvalidArgument(
                    f"input '{name}' has binary_data_size {size!r}, but {len(binary) - offset} binary bytes are "
                    f"left after the {header_length} byte JSON header"
                )
            tensors.append(from_bytes(name, datatype, shape, binary[offset : offset + size]))
            offset += size
        elif "data" in item:
            tensors.append(from_values(name, datatype, shape, item["data"]))
        else:
            raise InvalidArgument(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    if offset != len(binary):
        raise InvalidArgument(f"{len(binary) - offset} bytes after the JSON header belong to no input")
    outputs = doc.get("outputs", [])
    for output in outputs if isinstance(outputs, list) else ():
        _check_parameters(
            output, f"output {output.get('name')!r}" if isinstance(output, dict) else "an output"
        )
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
    ):
        raise InvalidArgument("'outputs' must be a list of objects with a string 'name'")
    return InferRequest(doc, tensors)


def _check_parameters(item: Any, what: str) -> None:
    if isinstance(item, dict) and not isinstance(item.get("parameters", {}), dict):
        raise InvalidArgument(f"{what} has 'parameters' {item['parameters']!r}; send an object")


def _loads(text: bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        try:  # NaN (a missing count) is not JSON, but Python's json writes it and so tritonclient sends it
            return json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"malformed JSON body: {exc}") from exc
        except RecursionError as exc:
            raise InvalidArgument("malformed JSON body: nested too deeply") from exc


def _requested_outputs(request: InferRequest) -> dict[str, bool]:
    """Requested output name -> binary? ({} when the request names none: every output)."""
    default = boolean_parameter(request.parameters, "binary_data_output", "parameters")
    return {
        o["name"]: boolean_parameter(
            o.get("parameters") or {}, "binary_data", f"output '{o['name']}'", default
        )
        for o in request.outputs
    }


def boolean_parameter(parameters: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    """A boolean parameter: a JSON true or false only (`"false"` is a string, and a string is no answer)."""
    value = parameters.get(key, default)
    if type(value) is not bool:
        raise InvalidArgument(
            f"{where} has {key} {json.dumps(value)} ({_json_type(value)}); send a JSON boolean, true or false"
        )
    return value


def _json_type(value: Any) -> str:
    return {str: "a string", int: "a number", float: "a number", dict: "an object", list: "an array"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def encode_response(
    v2_name: str, version: int, request_id: str | None, outputs: list[tuple[str, np.ndarray, bool]]
) -> tuple[int, bytes, bytes]:
    """The infer response of (name, (N, K) scores, binary?) outputs: JSON, or the JSON header then each binary
    output's raw FP32 bytes in the header's order (the binary tensor extension)."""
    tensors, raw = [], []
    for name, scores, binary in outputs:
        tensor: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": list(scores.shape)}
        if binary:
            raw.append(np.ascontiguousarray(scores, "<f4").tobytes())
            tensor["parameters"] = {"binary_data_size": len(raw[-1])}
        else:
            tensor["data"] = np.ascontiguousarray(scores).reshape(-1)  # orjson writes C order only
        tensors.append(tensor)
    doc: dict[str, Any] = {"model_name": v2_name, "model_version": str(version), "outputs": tensors}
    if request_id is not None:
        doc["id"] = request_id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not raw:
        return 200, head, JSON
    # The connection writes the content type as a header line: the header length rides along as the next one.
    return 200, head + b"".join(raw), BINARY + b"\r\n%s: %d" % (HEADER_LENGTH.encode(), len(head))
