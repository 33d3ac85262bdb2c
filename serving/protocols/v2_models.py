"""The v2 view of the served models: names (`M` and `M_raw`), readiness and metadata, for REST and gRPC."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from serving.codecs.v2_codec import PLATFORMS, io_spec, split_model_name
from serving.dataplane.predictor import Predictor
from serving.errors import NotFound, ServingError
from serving.runtime.servable import LoadedVersion
from serving.signatures import RAW_SIGNATURE

SERVER_NAME = "ctr-pipeline"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data"]


class V2Models:
    """Looks up the predictor behind a v2 model name; `predictors()` is the current name -> Predictor map."""

    def __init__(self, predictors: Callable[[], dict[str, Predictor]]) -> None:
        self.predictors = predictors

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    def all_ready(self) -> bool:
        """Ready when every configured model has an available version and the server is not draining."""
        served = self.predictors().values()
        return bool(served) and all(p.manager.latest is not None and not p.draining for p in served)

    def lookup(self, v2_name: str) -> tuple[Predictor, str]:
        """(predictor, signature key) of a v2 model name; NotFound for an unknown one."""
        predictors = self.predictors()
        name, signature = split_model_name(v2_name, set(predictors))
        if name not in predictors:
            raise NotFound(f"Request for unknown model: '{v2_name}' is not found")
        return predictors[name], signature

    def resolve(self, v2_name: str, version: int | None) -> tuple[LoadedVersion, str]:
        """The version serving a v2 model (NotFound / Unavailable as v1), and its signature key."""
        predictor, signature = self.lookup(v2_name)
        servable = predictor.manager.resolve(predictor.manager.name, version)
        if signature == RAW_SIGNATURE and not servable.backend.signature.has_raw:
            raise NotFound(
                f"model '{v2_name}' is not served: version {servable.version} has no raw signature"
            )
        return servable, signature

    def model_ready(self, v2_name: str, version: int | None) -> bool:
        """True when the model (version) can answer now; NotFound for an unknown model."""
        predictor, _ = self.lookup(v2_name)
        if predictor.draining:
            return False
        try:
            self.resolve(v2_name, version)
        except ServingError:
            return False
        return True

    def model_metadata(self, v2_name: str, version: int | None) -> dict[str, Any]:
        """`{"name", "versions", "platform", "inputs", "outputs"}` of a v2 model."""
        servable, signature = self.resolve(v2_name, version)
        predictor, _ = self.lookup(v2_name)
        inputs, outputs = io_spec(servable.backend.signature, signature)
        return {
            "name": v2_name,
            "versions": [str(v) for v in sorted(predictor.manager.loaded)],
            "platform": PLATFORMS.get(servable.backend.runtime, servable.backend.runtime),
            "inputs": inputs,
            "outputs": outputs,
        }
