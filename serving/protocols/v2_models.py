"""The v2 view of the served models: names (`M` and `M_raw`), readiness and metadata, for REST and gRPC.

Also Triton's extensions, as the JSON both protocols answer (gRPC parses it into Triton's messages):
`model_configuration` (Triton's config of a model), `statistics` (counts and durations per model version,
from serving/observability/metrics.py, all workers' merged) and `model_repository` (the index, read-only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from serving.codecs.v2_codec import PLATFORMS, RAW_SUFFIX, io_spec, split_model_name
from serving.dataplane.predictor import Predictor
from serving.errors import InvalidArgument, NotFound, ServingError, Unimplemented
from serving.repository.policy import VersionPolicy
from serving.runtime.batcher import DynamicBatcher
from serving.runtime.servable import LoadedVersion
from serving.signatures import RAW_SIGNATURE

SERVER_NAME = "ctr-pipeline"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]
BACKENDS = {"ONNXRuntime": "onnxruntime", "TF2": "tensorflow"}
CONFIG_TYPES = {"FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BYTES": "TYPE_STRING"}
# Our version states (serving/repository/states.py) as Triton's repository index names them.
INDEX_STATES = {"START": "LOADING", "LOADING": "LOADING", "AVAILABLE": "READY", "UNLOADING": "UNLOADING"}
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
LOAD_UNLOAD = (
    "model {action} is not served: this server loads the versions its model repository holds, by each "
    "model's version policy. To add or remove a model, edit the --model_config_file (read again every "
    "--model_config_file_poll_wait_seconds); to add a version, publish it into the model's base path"
)


class V2Models:
    """Looks up the predictor behind a v2 model name; `predictors()` is the current name -> Predictor map."""

    def __init__(self, predictors: Callable[[], dict[str, Predictor]]) -> None:
        self.predictors = predictors

    def server_metadata(self) -> dict[str, Any]:
        """Triton's server metadata; `statistics` is listed only while the server keeps them."""
        served = list(self.predictors().values())
        kept = not served or served[0].statistics
        extensions = EXTENSIONS if kept else [e for e in EXTENSIONS if e != "statistics"]
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": extensions}

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
        servable = predictor.router.resolve(predictor.manager.name, version)
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

    def model_config(self, v2_name: str, version: int | None) -> dict[str, Any]:
        """Triton's model configuration (its JSON form) of a v2 model, for the version that would serve it."""
        servable, signature = self.resolve(v2_name, version)
        predictor, _ = self.lookup(v2_name)
        inputs, outputs = io_spec(servable.backend.signature, signature)
        runtime = servable.backend.runtime
        config: dict[str, Any] = {
            "name": v2_name,
            "platform": PLATFORMS.get(runtime, runtime),
            "backend": BACKENDS.get(runtime, runtime),
            "version_policy": _version_policy(predictor.manager.policy),
            # The batch dimension is the first and is left out of dims, as Triton writes a batching model.
            "max_batch_size": predictor.limits.max_instances,
            "input": [_config_tensor(t) for t in inputs],
            "output": [_config_tensor(t) for t in outputs],
        }
        batcher = servable.runners.get(signature)
        if isinstance(batcher, DynamicBatcher):
            config["dynamic_batching"] = {
                "preferred_batch_size": [batcher.max_batch_size],
                "max_queue_delay_microseconds": round(batcher.batch_timeout_s * 1e6),
            }
        return config

    def v2_names(self, predictor: Predictor) -> list[str]:
        """The v2 models of one served model: `M`, and `M_raw` when its newest version has the raw signature."""
        name, latest = predictor.manager.name, predictor.manager.latest
        has_raw = latest is not None and latest.backend.signature.has_raw
        return [name, name + RAW_SUFFIX] if has_raw else [name]

    def statistics(self, v2_name: str | None, version: int | None) -> dict[str, Any]:
        """Triton's statistics of every loaded version of one v2 model (all models when `v2_name` is None);
        Unimplemented (501) when the server keeps none (`--model_statistics=false`)."""
        served = list(self.predictors().values())
        if served and not served[0].statistics:
            raise Unimplemented("model statistics are off on this server (--model_statistics=false)")
        if v2_name is not None:
            predictor, _ = self.lookup(v2_name)
            servable, _ = self.resolve(v2_name, version)
            targets = [
                (v2_name, [servable.version] if version is not None else sorted(predictor.manager.loaded))
            ]
        else:
            targets = [
                (name, sorted(p.manager.loaded))
                for p in self.predictors().values()
                for name in self.v2_names(p)
            ]
        table = served[0].metrics.statistics() if served else {}
        return {"model_stats": [_model_stats(table, n, v) for n, versions in targets for v in versions]}

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every v2 model and version with its state (READY, LOADING, ...)."""
        index = []
        for predictor in sorted(self.predictors().values(), key=lambda p: p.manager.name):
            manager = predictor.manager
            for v2_name in self.v2_names(predictor):
                for state in sorted(manager.states.values(), key=lambda s: s.version):
                    loaded = manager.loaded.get(state.version)
                    entry = {
                        "name": v2_name,
                        "version": str(state.version),
                        "state": INDEX_STATES.get(state.state, "UNAVAILABLE"),
                        "reason": state.error_message,
                    }
                    if (
                        v2_name != manager.name
                        and loaded is not None
                        and not loaded.backend.signature.has_raw
                    ):
                        entry |= {"state": "UNAVAILABLE", "reason": "this version has no raw signature"}
                    if not ready_only or entry["state"] == "READY":
                        index.append(entry)
        return index

    def load_or_unload(self, action: str, v2_name: str) -> None:
        """Triton's load and unload: always a 400 naming the way this server adds and removes models."""
        raise InvalidArgument(f"{LOAD_UNLOAD.format(action=action)} ('{v2_name}' is left as it is)")


def _config_tensor(tensor: dict[str, Any]) -> dict[str, Any]:
    """A metadata tensor (`shape` with the batch dimension) as a config input or output (`dims` without it)."""
    dims = tensor["shape"][1:]
    entry: dict[str, Any] = {"name": tensor["name"], "data_type": CONFIG_TYPES[tensor["datatype"]]}
    if not dims:  # one value per row: Triton's way is dims [1] reshaped to a scalar per row
        return entry | {"dims": [1], "reshape": {"shape": []}}
    return entry | {"dims": dims}


def _version_policy(policy: VersionPolicy) -> dict[str, Any]:
    if policy.kind == "all":
        return {"all": {}}
    if policy.kind == "specific":
        return {"specific": {"versions": list(policy.versions)}}
    return {"latest": {"num_versions": policy.num_versions}}


def _model_stats(
    table: dict[tuple[str, str], dict[str, float]], v2_name: str, version: int
) -> dict[str, Any]:
    """One ModelStatistics entry (Triton's JSON): counts as integers, durations as {count, ns}."""
    row = table.get((v2_name, str(version)), {})

    def value(stat: str) -> int:
        return int(row.get(stat, 0))

    success = value("success")
    durations = {
        name: {"count": value("fail") if name == "fail" else success, "ns": value(f"{name}_ns")}
        for name in DURATIONS
    }
    return {
        "name": v2_name,
        "version": str(version),
        "last_inference": value("last_inference"),
        "inference_count": value("inference_count"),
        "execution_count": value("execution_count"),
        "inference_stats": durations
        | {"cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
        "batch_stats": [],
    }
