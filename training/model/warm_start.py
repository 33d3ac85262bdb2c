"""`python -m training --init-from PATH`: start from yesterday's network and keep its FeatureSpec frozen.

PATH is any of:
- a checkpoint file (`RUN/checkpoints/best.ckpt`); its spec is `RUN/feature_spec.json`;
- a training run directory (uses its best checkpoint and spec);
- a published version folder (`<repo>/<N>`): weights from `model.onnx`, whose initializers keep the
  network's parameter names (`net.layers.0.weight`, ...), spec from `assets.extra/feature_spec.json`;
- a model base path (`<repo>`): its newest version, i.e. what the server serves.

The FeatureSpec is frozen: the new run transforms its data with the spec it starts from instead of fitting
one. Every input column then keeps the meaning the weights were trained on, and the version it exports
takes exactly the vectors the served one takes, so clients and the raw-field transform need no change.
What is given up: counts whose scale drifted are normalised with yesterday's mean and std, and categorical
values that became frequent since the spec was fitted have no click-rate lift (they still reach the
network through the hashing buckets). A full retrain (no `--init-from`) refits everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper

from ctr_contract import repository, run_dir
from ctr_features.spec import FeatureSpec
from ctr_model.checkpoint import NET_PREFIX, read_checkpoint
from ctr_model.errors import CheckpointError
from ctr_model.net import CTRNet, ModelConfig


@dataclass(frozen=True)
class WarmStart:
    """What a warm-started run takes over: the network's shape and weights, and the frozen spec."""

    source: Path
    model: ModelConfig
    state: dict[str, torch.Tensor]
    spec: FeatureSpec

    def apply(self, net: CTRNet) -> None:
        """Copy the weights into `net` (built from `self.model`)."""
        try:
            net.load_state_dict(self.state)
        except RuntimeError as e:
            raise CheckpointError(f"--init-from {self.source}: weights do not fit {self.model}: {e}") from e


def load_warm_start(path: Path) -> WarmStart:
    """Read weights, model config and FeatureSpec from a checkpoint, run dir, version folder or base path.

    Raises:
        CheckpointError: nothing usable at `path`, or the files are unreadable or inconsistent.
    """
    path = Path(path)
    if path.is_file():
        return _from_checkpoint(path, path.parent.parent / run_dir.FEATURE_SPEC)
    if (path / run_dir.BEST_CHECKPOINT).is_file():
        return _from_checkpoint(path / run_dir.BEST_CHECKPOINT, path / run_dir.FEATURE_SPEC)
    if (path / repository.ONNX_MODEL).is_file():
        return _from_version(path)
    if path.is_dir():
        versions = repository.version_dirs(path)
        if versions:
            return _from_version(versions[max(versions)])
    raise CheckpointError(
        f"--init-from {path}: expected a checkpoint, a run directory, a version folder (with "
        f"{repository.ONNX_MODEL}) or a model base path holding versions"
    )


def _from_checkpoint(ckpt_path: Path, spec_path: Path) -> WarmStart:
    ckpt = read_checkpoint(ckpt_path)
    model = ModelConfig.from_dict((ckpt.get("hyper_parameters") or {}).get("model", {}))
    state = {k[len(NET_PREFIX) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(NET_PREFIX)}
    if not state:
        raise CheckpointError(f"checkpoint {ckpt_path} holds no '{NET_PREFIX}*' weights")
    return WarmStart(ckpt_path, model, state, _spec(spec_path, model))


def _from_version(version_dir: Path) -> WarmStart:
    manifest_path = version_dir / repository.MANIFEST_PATH
    try:
        manifest = json.loads(manifest_path.read_text())
        model = ModelConfig.from_dict(manifest["source_checkpoint"]["model"] or {})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"--init-from {version_dir}: cannot read the model config in {manifest_path}: {e}"
        ) from e
    graph = onnx.load(str(version_dir / repository.ONNX_MODEL)).graph
    # The exporter names initializers after the module's parameters: "net." + CTRNet's state_dict keys.
    state = {
        init.name[len(NET_PREFIX) :]: torch.from_numpy(numpy_helper.to_array(init).copy())
        for init in graph.initializer
        if init.name.startswith(NET_PREFIX)
    }
    if not state:
        raise CheckpointError(
            f"--init-from {version_dir}: {repository.ONNX_MODEL} has no '{NET_PREFIX}*' weights"
        )
    return WarmStart(version_dir, model, state, _spec(version_dir / repository.FEATURE_SPEC_PATH, model))


def _spec(path: Path, model: ModelConfig) -> FeatureSpec:
    if not path.is_file():
        raise CheckpointError(f"--init-from needs the feature spec {path} beside the weights")
    try:
        spec = FeatureSpec.load(path)
    except ValueError as e:
        raise CheckpointError(f"--init-from: {e}") from e
    if spec.width != model.width:
        raise CheckpointError(
            f"feature spec {path} has width {spec.width} but the network takes {model.width}"
        )
    return spec
