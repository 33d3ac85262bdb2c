"""Open Inference Protocol v2 over REST (KServe/Triton), on the REST port beside TF Serving's v1 routes.

Routes:
    GET  /v2                                          server metadata
    GET  /v2/health/live, /v2/health/ready            liveness; readiness (every model has an available version)
    GET  /v2/models/{m}[/versions/{v}]                model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready          model readiness (200 or 503)
    POST /v2/models/{m}[/versions/{v}]/infer          inference: JSON, or the binary tensor extension
The router (serving/protocols/router.py) sends /v2 paths here; errors are `{"error": "..."}` with the status of
the ServingError (serving/errors.py), as on v1. Inference goes through the same Predictor as v1 (batching,
limits, metrics, request log, drift).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import orjson

from serving.codecs.v2_codec import V2Tensor, check_shape, from_bytes, from_values, to_request
from serving.dataplane.validation import parse_version
from serving.errors import JSON, InvalidArgument, NotFound
from serving.http.messages import require_method
from serving.protocols.rest_body import BodyDecoder
from serving.protocols.v2_models import V2Models
from serving.requests import DecodedRequest
from serving.signatures import RAW_SIGNATURE, Signature

V2_ROUTE = re.compile(
    r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<action>/ready|/infer)?$"
)
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
        path: str,
        body: bytes | bytearray,
        header_length: int | None,
        request_id: str | None,
    ) -> tuple[int, bytes, bytes]:
        """Answer one /v2 request; raises ServingError (the router renders it)."""
        if path in ("/v2", "/v2/health/live", "/v2/health/ready"):
            require_method(method, "GET")
            if path == "/v2":
                return 200, orjson.dumps(self.models.server_metadata()), JSON
            if path == "/v2/health/live":
                return 200, b'{"live": true}', JSON
            ready = self.models.all_ready()
            return (200 if ready else 503), orjson.dumps({"ready": ready}), JSON
        route = V2_ROUTE.match(path)
        if route is None:
            raise NotFound(f"Malformed request: {method} {path}")
        name, action = route["name"], route["action"]
        version = parse_version(route["version"])
        if action == "/infer":
            require_method(method, "POST")
            return await self._infer(name, version, body, header_length, request_id)
        require_method(method, "GET")
        if action == "/ready":
            ready = self.models.model_ready(name, version)
            return (200 if ready else 503), orjson.dumps({"name": name, "ready": ready}), JSON
        return 200, orjson.dumps(self.models.model_metadata(name, version)), JSON

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
            unknown = set(wanted) - {sig.output_name}
            if unknown:
                raise InvalidArgument(
                    f"outputs names {sorted(unknown)}; the only output is '{sig.output_name}'"
                )
            return to_request(request.tensors, sig, signature)

        scores, servable, _ = await predictor.predict(
            predictor.manager.name, version, None, decode, "REST", request_id
        )
        binary_default = bool(request.parameters.get("binary_data_output", False))
        output_name = servable.backend.signature.output_name
        binary = wanted.get(output_name, binary_default) if wanted else binary_default
        return encode_response(v2_name, servable.version, request.id, output_name, scores, binary)


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
    default = bool(request.parameters.get("binary_data_output", False))
    return {o["name"]: bool((o.get("parameters") or {}).get("binary_data", default)) for o in request.outputs}


def encode_response(
    v2_name: str, version: int, request_id: str | None, output: str, scores: np.ndarray, binary: bool
) -> tuple[int, bytes, bytes]:
    """The infer response: JSON, or the JSON header then the raw FP32 scores (binary tensor extension)."""
    tensor: dict[str, Any] = {"name": output, "datatype": "FP32", "shape": list(scores.shape)}
    raw = b""
    if binary:
        raw = np.ascontiguousarray(scores, "<f4").tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = scores.reshape(-1)
    doc: dict[str, Any] = {"model_name": v2_name, "model_version": str(version), "outputs": [tensor]}
    if request_id is not None:
        doc["id"] = request_id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not binary:
        return 200, head, JSON
    # The connection writes the content type as a header line: the header length rides along as the next one.
    return 200, head + raw, BINARY + b"\r\n%s: %d" % (HEADER_LENGTH.encode(), len(head))
