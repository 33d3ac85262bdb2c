"""TF Serving's gRPC API (port 8500) on grpc.aio, with the protos of tensorflow-serving-api.

Generic method handlers serve `/tensorflow.serving.PredictionService/{Predict,GetModelMetadata}` and
`/tensorflow.serving.ModelService/GetModelStatus`, so the stock `PredictionServiceStub` works unchanged; the
router (serving/protocols/router.py) registers them on the gRPC server beside the v2 service.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from serving import protos
from serving.codecs.grpc_codec import to_request
from serving.codecs.tensors import from_ndarray
from serving.dataplane.model_set import ServedModels
from serving.errors import InvalidArgument
from serving.observability import tracing
from serving.observability.request_log import request_id_from
from serving.protocols.grpc_calls import add_trailing, deadline_of, unary
from serving.protocols.model_info import metadata_response, status_response
from serving.requests import DecodedRequest
from serving.signatures import Signature


def _spec(model_spec: Any) -> tuple[str, int | None, str | None]:
    """ModelSpec -> (name, version or None, label or None)."""
    choice = model_spec.WhichOneof("version_choice")
    version = model_spec.version.value if choice == "version" else None
    label = model_spec.version_label if choice == "version_label" else None
    return model_spec.name, version, label


class PredictionServicer:
    """Implements the three RPCs on top of the shared Predictor."""

    def __init__(self, models: ServedModels) -> None:
        self.models = models

    async def predict(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not tracing.ACTIVE:
            return await self._predict(request, context, ())
        metadata = dict(context.invocation_metadata() or ())
        span, token, answer = tracing.begin("predict", metadata.get("traceparent"), "GRPC")
        error: str | None = "INTERNAL"
        try:
            response = await self._predict(
                request, context, (("traceparent", answer.decode()),) if answer else ()
            )
            error = None
            return response
        finally:
            tracing.end(span, token, error)

    async def _predict(
        self, request: Any, context: grpc.aio.ServicerContext, trailing: tuple[tuple[str, str], ...]
    ) -> Any:
        """Predict; `trailing`: metadata the answer ends with (the traceparent, with tracing on)."""
        name, version, label = _spec(request.model_spec)

        async def decode(sig: Signature) -> DecodedRequest:
            return to_request(request, sig)

        request_id = None
        predictor = self.models.lookup(name)
        if predictor.request_log is not None or predictor.router.traffic.active:  # only when logged or split
            metadata = dict(context.invocation_metadata() or ())
            request_id = request_id_from(metadata.get("x-request-id"))
            trailing = (*trailing, ("x-request-id", request_id))
        if trailing:
            context.set_trailing_metadata(trailing)
        prediction = await predictor.predict(
            name, version, label, decode, "GRPC", request_id, deadline=deadline_of(context)
        )
        scores, servable, decoded = prediction.scores, prediction.servable, prediction.request
        if prediction.fallback is not None:
            add_trailing(context, "x-ctr-fallback", prediction.fallback)
        response = protos.PredictResponse()
        response.model_spec.name = name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = decoded.signature
        started = time.perf_counter()
        sig = servable.backend.signature
        # Every output unless output_filter names some (TF Serving's rule); to_request checked the names.
        for output in sig.requested(request.output_filter, "output_filter"):
            from_ndarray(sig.output(scores, output), response.outputs[output])
        span = tracing.current() if tracing.ACTIVE else None
        if span is not None:
            tracing.child(span, "encode", started)
        return response

    async def get_model_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        fields = set(request.metadata_field)
        if fields != {"signature_def"}:
            raise InvalidArgument(f"metadata_field must be ['signature_def'], got {sorted(fields)}")
        name, version, label = _spec(request.model_spec)
        servable = self.models.lookup(name).router.resolve(name, version, label)
        return metadata_response(name, servable.version, servable.backend.signature)

    async def get_model_status(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name, version, label = _spec(request.model_spec)
        predictor = self.models.lookup(name)
        if label is not None:
            version = predictor.router.resolve(name, None, label).version
        return status_response(predictor.manager.status(name, version))


def tfs_handlers(models: ServedModels) -> tuple[grpc.GenericRpcHandler, ...]:
    """The generic handlers of TF Serving's two services (serving/protocols/router.py registers them)."""
    servicer = PredictionServicer(models)
    return (
        grpc.method_handlers_generic_handler(
            "tensorflow.serving.PredictionService",
            {
                "Predict": unary(servicer.predict, protos.PredictRequest),
                "GetModelMetadata": unary(servicer.get_model_metadata, protos.GetModelMetadataRequest),
            },
        ),
        grpc.method_handlers_generic_handler(
            "tensorflow.serving.ModelService",
            {"GetModelStatus": unary(servicer.get_model_status, protos.GetModelStatusRequest)},
        ),
    )
