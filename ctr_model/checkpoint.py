"""Reading checkpoints back into the pure network: the contract export relies on.

A checkpoint is what Lightning writes (a `torch.save`d dict). The keys we depend on:
- `state_dict`: the LightningModule's weights; the network sits under the `net.` prefix.
- `hyper_parameters["model"]`: `ModelConfig.to_dict()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ctr_model.errors import CheckpointError
from ctr_model.net import CTRNet, ModelConfig

NET_PREFIX = "net."


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load the raw checkpoint dict, with a clear error when the file is missing or corrupt."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint not found: {p}")
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises several types for a truncated/garbage file
        raise CheckpointError(f"checkpoint {p} is corrupt or not a torch checkpoint: {e}") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {p} has no 'state_dict'; expected a Lightning checkpoint")
    return ckpt


def load_net(path: str | Path) -> tuple[CTRNet, dict[str, Any]]:
    """Rebuild the CTRNet in eval mode from a checkpoint.

    Returns:
        (net, checkpoint dict) — the dict carries `hyper_parameters`, `epoch`, `global_step`.
    """
    ckpt = read_checkpoint(path)
    hp = ckpt.get("hyper_parameters") or {}
    cfg = ModelConfig.from_dict(hp.get("model", {}))
    state = {k[len(NET_PREFIX) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(NET_PREFIX)}
    if not state:
        raise CheckpointError(f"checkpoint {path} holds no '{NET_PREFIX}*' weights")
    net = CTRNet(cfg)
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path} does not match ModelConfig {cfg}: {e}") from e
    net.eval()
    return net, ckpt
