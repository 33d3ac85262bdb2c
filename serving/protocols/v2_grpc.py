"""Open Inference Protocol v2 over gRPC: `inference.GRPCInferenceService` on the gRPC port beside TF Serving's.

Serves ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer (tensors in `contents`
or `raw_input_contents`; scores always in `raw_output_contents`, as Triton answers), and Triton's extensions:
ModelConfig, ModelStatistics, RepositoryIndex (RepositoryModelLoad and Unload answer INVALID_ARGUMENT naming
`--model_config_file`). Other RPCs of the service (streaming, shared memory, trace, log settings) are
UNIMPLEMENTED. Inference goes through the same Predictor as v1.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from serving.codecs.v2_codec import V2Tensor, check_shape, from_bytes, from_values, to_request
from serving.dataplane.validation import parse_version
from serving.errors import InvalidArgument, NotFound
from serving.observability import tracing
from serving.observability.request_log import request_id_from
from serving.protocols.grpc_calls import add_trailing, deadline_of, unary
from serving.protocols.v2_models import V2Models
from serving.protos import v2 as protos
from serving.requests import DecodedRequest
from serving.signatures import RAW_SIGNATURE, Signature

# InferTensorContents field of each datatype (the v2 gRPC spec's table).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class InferenceServicer:
    """The v2 RPCs over the served models."""

    def __init__(self, models: V2Models) -> None:
        self.models = models

    async def server_live(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return protos.RPCS["ServerLive"][1](live=True)

    async def server_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return protos.RPCS["ServerReady"][1](ready=self.models.all_ready())

    async def model_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = self.models.model_ready(request.name, parse_version(request.version or None))
        return protos.RPCS["ModelReady"][1](ready=ready)

    async def server_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return protos.RPCS["ServerMetadata"][1](**self.models.server_metadata())

    async def model_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        meta = self.models.model_metadata(request.name, parse_version(request.version or None))
        response = protos.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for field in ("inputs", "outputs"):
            for tensor in meta[field]:
                getattr(response, field).add(**tensor)
        return response

    async def model_config(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        config = self.models.model_config(request.name, parse_version(request.version or None))
        response = protos.RPCS["ModelConfig"][1]()
        json_format.ParseDict(config, response.config, descriptor_pool=protos.pool())
        return response

    async def model_statistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        stats = self.models.statistics(request.name or None, parse_version(request.version or None))
        return json_format.ParseDict(
            stats, protos.RPCS["ModelStatistics"][1](), descriptor_pool=protos.pool()
        )

    async def repository_index(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        index = {"models": self.models.repository_index(request.ready)}
        return json_format.ParseDict(
            index, protos.RPCS["RepositoryIndex"][1](), descriptor_pool=protos.pool()
        )

    async def repository_model_load(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.models.load_or_unload("load", request.model_name)

    async def repository_model_unload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.models.load_or_unload("unload", request.model_name)

    async def model_infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not tracing.ACTIVE:
            return await self._model_infer(request, context)
        metadata = dict(context.invocation_metadata() or ())
        span, token, answer = tracing.begin("infer", metadata.get("traceparent"), "GRPC")
        if answer:  # not for an unsampled request that sent no traceparent
            context.set_trailing_metadata((("traceparent", answer.decode()),))
        error: str | None = "INTERNAL"
        try:
            response = await self._model_infer(request, context)
            error = None
            return response
        finally:
            tracing.end(span, token, error)

    async def _model_infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        predictor, signature = self.models.lookup(request.model_name)
        version = parse_version(request.model_version or None)
        tensors = decode_inputs(request)
        wanted = [o.name for o in request.outputs]

        async def decode(sig: Signature) -> DecodedRequest:
            if signature == RAW_SIGNATURE and not sig.has_raw:
                raise NotFound(
                    f"model '{request.model_name}' is not served: this version has no raw signature"
                )
            sig.requested(wanted, "outputs")
            return to_request(tensors, sig, signature)

        request_id = None
        if predictor.request_log is not None or predictor.router.traffic.active:  # only when logged or split
            request_id = request_id_from(dict(context.invocation_metadata() or ()).get("x-request-id"))
        prediction = await predictor.predict(
            predictor.manager.name, version, None, decode, "GRPC", request_id, deadline=deadline_of(context)
        )
        scores, servable = prediction.scores, prediction.servable
        if prediction.fallback is not None:
            add_trailing(context, "x-ctr-fallback", prediction.fallback)
        started = time.perf_counter()
        response = protos.ModelInferResponse(
            model_name=request.model_name, model_version=str(servable.version), id=request.id
        )
        sig = servable.backend.signature
        # Every output unless `outputs` names some, in its order: each output's header here, its values in
        # raw_output_contents (one entry per output, in the same order).
        for name in sig.requested(wanted, "outputs"):
            values = sig.output(scores, name)
            response.outputs.add(name=name, datatype="FP32", shape=list(values.shape))
            response.raw_output_contents.append(np.ascontiguousarray(values, "<f4").tobytes())
        span = tracing.current() if tracing.ACTIVE else None
        if span is not None:
            tracing.child(span, "encode", started)
        return response


def decode_inputs(request: Any) -> list[V2Tensor]:
    """ModelInferRequest inputs -> tensors, from `raw_input_contents` (one per input, in order) or `contents`."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; send one per input"
        )
    tensors = []
    for i, item in enumerate(request.inputs):
        shape = check_shape(item.name, list(item.shape))
        if raw:
            tensors.append(from_bytes(item.name, item.datatype, shape, raw[i]))
            continue
        field = CONTENTS_FIELD.get(item.datatype)
        if field is None:
            raise InvalidArgument(f"input '{item.name}' has datatype {item.datatype!r}, not a v2 datatype")
        values = getattr(item.contents, field)
        tensors.append(from_values(item.name, item.datatype, shape, list(values)))
    return tensors


def v2_handler(models: V2Models) -> grpc.GenericRpcHandler:
    """The generic handler of `inference.GRPCInferenceService` (serving/protocols/router.py registers it)."""
    servicer = InferenceServicer(models)
    methods = {
        "ServerLive": servicer.server_live,
        "ServerReady": servicer.server_ready,
        "ModelReady": servicer.model_ready,
        "ServerMetadata": servicer.server_metadata,
        "ModelMetadata": servicer.model_metadata,
        "ModelInfer": servicer.model_infer,
        "ModelConfig": servicer.model_config,
        "ModelStatistics": servicer.model_statistics,
        "RepositoryIndex": servicer.repository_index,
        "RepositoryModelLoad": servicer.repository_model_load,
        "RepositoryModelUnload": servicer.repository_model_unload,
    }
    return grpc.method_handlers_generic_handler(
        protos.SERVICE, {rpc: unary(method, protos.RPCS[rpc][0]) for rpc, method in methods.items()}
    )
