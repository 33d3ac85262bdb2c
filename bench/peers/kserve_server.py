"""KServe's ModelServer with a custom Model running ONNX Runtime on model.onnx (the comparison baseline).

Runs in `.venv-kserve` (kserve pins dependencies that clash with TensorFlow):
    .venv-kserve/bin/python bench/peers/kserve_server.py --model_path V/model.onnx --model_name ctr \
        --http_port 8080 --workers 1 --enable_grpc false --enable_latency_logging false --configure_logging false
It serves the same TF-Serving v1 REST route: POST /v1/models/ctr:predict {"instances": [[128 floats]]}.
"""

from __future__ import annotations

import argparse
from typing import Any

import kserve
import numpy as np
import onnxruntime as ort


class OnnxCTRModel(kserve.Model):
    """`predict`: instances (N, 128) -> predictions (N, 1), ORT with one intra-op thread like our server."""

    def __init__(self, name: str, model_path: str) -> None:
        super().__init__(name)
        self.model_path = model_path
        self.session: ort.InferenceSession | None = None

    def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.model_path, opts, providers=["CPUExecutionProvider"])
        self.ready = True
        return self.ready

    async def predict(
        self, payload: Any, headers: Any = None, response_headers: Any = None
    ) -> dict[str, Any]:
        assert self.session is not None
        features = np.asarray(payload["instances"], dtype=np.float32)
        scores = self.session.run(None, {"features": features})[0]
        return {"predictions": scores.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model_path", required=True, help="model.onnx of one repository version")
    args, _ = parser.parse_known_args()
    model = OnnxCTRModel(args.model_name, args.model_path)
    model.load()
    kserve.ModelServer().start([model])


if __name__ == "__main__":
    main()
