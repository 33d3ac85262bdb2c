"""The naive baseline: FastAPI + pydantic + PyTorch eager on the training checkpoint, one uvicorn worker.

    python -m bench.peers.naive_fastapi_server --checkpoint artifacts/run/checkpoints/best.ckpt --port 8080
Serves POST /v1/models/ctr:predict {"instances": [[128 floats]]} -> {"predictions": [[p]]}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from ctr_model.checkpoint import load_net
from ctr_model.net import CTRProbability


class PredictRequest(BaseModel):
    instances: list[list[float]]


def build_app(checkpoint: Path) -> FastAPI:
    """The app: the checkpoint's network wrapped in a sigmoid, evaluated eagerly per request."""
    net, _ = load_net(checkpoint)
    model = CTRProbability(net).eval()
    app = FastAPI()

    @app.post("/v1/models/ctr:predict")
    def predict(request: PredictRequest) -> dict[str, list[list[float]]]:
        with torch.no_grad():
            scores = model(torch.tensor(request.instances, dtype=torch.float32))  # (N, 128) -> (N, 1)
        return {"predictions": scores.tolist()}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    torch.set_num_threads(1)
    uvicorn.run(build_app(args.checkpoint), host=args.host, port=args.port, workers=1, log_level="warning")


if __name__ == "__main__":
    main()
