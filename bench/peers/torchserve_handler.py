"""TorchServe handler for the bench: the exported TorchScript `model.pt` behind a TF-Serving-style JSON body.

Runs inside TorchServe's Python worker (`.venv-torchserve`); packed into `ctr.mar` by `bench.peers.torchserve_server`.
POST /predictions/ctr {"instances": [[128 floats], ...]} -> {"predictions": [[p], ...]}: the same payload as
our server's `/v1/models/ctr:predict`, on TorchServe's own predictions API.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch


class CTRHandler:
    """`initialize` loads model.pt with 1 intra-op thread (as every server in the bench); `handle` scores."""

    def __init__(self) -> None:
        self.model: torch.jit.ScriptModule | None = None
        self.initialized = False

    def initialize(self, context: Any) -> None:
        """Load the archive's serialized TorchScript file (TorchServe unpacks it into `model_dir`)."""
        torch.set_num_threads(1)
        model_dir = context.system_properties["model_dir"]
        serialized = context.manifest["model"]["serializedFile"]
        self.model = torch.jit.load(os.path.join(model_dir, serialized)).eval()
        self.initialized = True

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, Any]]:
        """One response per request of the (TorchServe-side) batch."""
        assert self.model is not None
        out = []
        for request in data:
            body: Any = request.get("body") or request.get("data")
            if isinstance(body, bytes | bytearray):  # no JSON content type: TorchServe passes the raw bytes
                body = json.loads(body)
            x = torch.tensor(body["instances"], dtype=torch.float32)  # (N, 128)
            with torch.inference_mode():
                scores = self.model(x)
            if isinstance(scores, tuple):  # export's model.pt: (ctr, raw_score), each (N, 1)
                scores = scores[0]
            out.append({"predictions": scores.tolist()})  # (N, 1) calibrated click probabilities
        return out
