"""The pure CTR network: a 3-layer MLP over the 128-float feature vector. No Lightning here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ctr_contract.signatures import DEFAULT_WIDTH
from ctr_model.dropout import MaskedDropout, MaskSource

ACTIVATIONS = ("relu", "hardtanh")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and activation of the MLP; saved in every checkpoint as `hyper_parameters["model"]`."""

    # The feature vector's width (FeatureSpec.width); checkpoints written before 2026-11-30 call it `in_features`.
    width: int = DEFAULT_WIDTH
    hidden1: int = 256
    hidden2: int = 128
    dropout1: float = 0.3
    dropout2: float = 0.2
    activation: str = "relu"

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        if "in_features" in d and "width" not in d:  # a checkpoint written before the field was renamed
            d = {**d, "width": d["in_features"]}
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def _activation(name: str) -> nn.Module:
    return nn.ReLU() if name == "relu" else nn.Hardtanh()


class CTRNet(nn.Module):
    """Linear(128,256) → act → Dropout(0.3) → Linear(256,128) → act → Dropout(0.2) → Linear(128,1).

    `forward` returns logits (train with BCE-with-logits); `predict_proba` applies the sigmoid.
    `mask_source` (installed by training) makes each dropout a `MaskedDropout` drawing its CPU masks from it
    (an `nn.Dropout` subclass, no parameters, same positions): the state_dict and the eval-mode graph export
    traces are the same either way.
    """

    def __init__(self, cfg: ModelConfig | None = None, mask_source: MaskSource | None = None) -> None:
        super().__init__()
        self.cfg = cfg or ModelConfig()
        c = self.cfg

        def dropout(p: float) -> nn.Dropout:
            return nn.Dropout(p) if mask_source is None else MaskedDropout(p, mask_source)

        self.layers = nn.Sequential(
            nn.Linear(c.width, c.hidden1),
            _activation(c.activation),
            dropout(c.dropout1),
            nn.Linear(c.hidden1, c.hidden2),
            _activation(c.activation),
            dropout(c.dropout2),
            nn.Linear(c.hidden2, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, 128) -> (B, 1) logits
        return self.layers(x)

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        # (B, 128) -> (B, 1) click probability: the very module export traces
        return CTRProbability(self)(x)


class CTRProbability(nn.Module):
    """features -> sigmoid(logits) of a logits network: a CTRNet, or the op-patched copy that export traces."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # (B, F) -> (B, 1)
        return torch.sigmoid(self.net(features))
