"""The server on a version made by the real pipeline: `training.synth` -> `training` -> `export` -> `serving`.

The other serving tests use a hand-built repository (tests/serving/model_repo.py); this one holds the seam
between export and serving: whatever export publishes, the server loads, verifies, warms and answers with the
checkpoint's own probabilities. Tiny on purpose: 4,000 rows, one epoch, no TorchScript.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from ctr_contract import (
    BEST_CHECKPOINT,
    DEFAULT_SIGNATURE,
    INPUT_NAME,
    MANIFEST_PATH,
    OUTPUT_NAME,
    VAL_FEATURES,
)
from ctr_model.checkpoint import load_net
from tests.conftest import RunModule
from tests.helpers import REPO_ROOT
from tests.serving.server_process import ServerProcess, http

ROWS = 64


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, run_module: RunModule) -> tuple[Path, Path]:
    """(run dir, model base path) after the three CLI steps."""
    root = tmp_path_factory.mktemp("pipeline")
    data, run, repo = root / "train.txt", root / "run", root / "models" / "ctr"
    run_module("training.synth", "--out", data, "--rows", "4000", "--seed", "3", check=True)
    run_module(
        "training",
        "--data",
        data,
        "--out",
        run,
        "--max-epochs",
        "1",
        "--batch-size",
        "512",
        "--no-progress-bar",
        check=True,
    )
    run_module("export", "--run", run, "--repo", repo, "--no-torchscript", check=True)
    return run, repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, exported: tuple[Path, Path]) -> Iterator[ServerProcess]:
    server = ServerProcess(exported[1], tmp_path_factory.mktemp("logs") / "server.log")
    server.wait_ready()
    yield server
    server.stop()


def test_the_exported_version_is_available(server: ServerProcess, exported: tuple[Path, Path]) -> None:
    status, body = http(server.url("/v1/models/ctr"))
    assert (status, body) == (
        200,
        {
            "model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ]
        },
    )
    manifest = json.loads((exported[1] / "1" / MANIFEST_PATH).read_text())
    assert manifest["version"] == 1


def test_metadata_is_the_exported_signature(server: ServerProcess) -> None:
    status, body = http(server.url("/v1/models/ctr/metadata"))
    assert status == 200
    signature = body["metadata"]["signature_def"]["signature_def"][DEFAULT_SIGNATURE]
    shape = {"dim": [{"size": "-1", "name": ""}, {"size": "128", "name": ""}], "unknown_rank": False}
    assert signature["inputs"][INPUT_NAME]["tensor_shape"] == shape
    assert [d["size"] for d in signature["outputs"][OUTPUT_NAME]["tensor_shape"]["dim"]] == ["-1", "1"]


def test_predictions_are_the_checkpoints_probabilities(
    server: ServerProcess, exported: tuple[Path, Path]
) -> None:
    run = exported[0]
    rows = np.load(run / VAL_FEATURES)[:ROWS]
    net, _ = load_net(run / BEST_CHECKPOINT)
    with torch.no_grad():
        expected = net.predict_proba(torch.from_numpy(rows)).numpy()
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": rows.tolist()})
    assert status == 200, body
    served = np.array(body["predictions"], dtype=np.float32)
    assert served.shape == (ROWS, 1)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)  # export's parity tolerance


def test_the_readme_request_is_answered(server: ServerProcess) -> None:
    """The raw Criteo row the README shows, sent as it is written there."""
    body = re.search(r"-d '(\{\"instances\": .+?\})'\n", (REPO_ROOT / "README.md").read_text())
    assert body, "README has no raw request example"
    status, answer = http(server.url("/v1/models/ctr:predict"), raw=body.group(1).encode())
    assert status == 200, answer
    [[p]] = answer["predictions"]
    assert 0 < p < 1
