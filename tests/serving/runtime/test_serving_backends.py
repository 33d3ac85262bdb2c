"""ONNX Runtime and TensorFlow backends serve the same predictions; serving/ never needs torch or TF."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.helpers import REPO_ROOT
from tests.serving.model_repo import reference_predict
from tests.serving.server_process import http

ROWS = np.random.default_rng(4).random((64, 128), dtype=np.float32)


def test_onnx_and_tf_backends_agree_within_1e_5(start_server, model_repo, weights) -> None:
    results = {}
    for backend in ("onnx", "tf"):
        server = start_server(model_repo, f"--backend={backend}")
        status, body = http(server.url("/v1/models/ctr:predict"), {"instances": ROWS.tolist()})
        assert status == 200, body
        results[backend] = np.asarray(body["predictions"])
        assert server.stop() == 0
    np.testing.assert_allclose(results["onnx"], results["tf"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(results["tf"], reference_predict(weights[1], ROWS), atol=1e-5, rtol=0)


def test_serving_imports_no_torch_lightning_training_or_tensorflow() -> None:
    code = (
        "import sys, serving.__main__, serving.app.server, serving.runtime.onnx_runtime, serving.repository.warmup;"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'lightning', 'training', 'tensorflow', 'tensorflow_serving', 'fastapi'})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json;" + code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert json.loads(out) == []
