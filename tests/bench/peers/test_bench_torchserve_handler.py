"""The bench's TorchServe handler scores the `model.pt` export writes: its (ctr, raw_score) tuple, ctr answered."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.peers.torchserve_handler import CTRHandler
from ctr_model.calibration import CalibratedNet, Calibrator
from ctr_model.net import CTRNet, ModelConfig
from export.gates.runtimes import write_torchscript


def test_the_handler_answers_ctr_of_the_exported_two_output_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = CTRNet(ModelConfig()).eval()
    calibrator = Calibrator("platt", a=0.5, b=-1.0)
    write_torchscript(net, 128, tmp_path / "model.pt", calibrator)
    handler = CTRHandler()
    handler.initialize(
        SimpleNamespace(
            system_properties={"model_dir": str(tmp_path)}, manifest={"model": {"serializedFile": "model.pt"}}
        )
    )
    x = [[0.5] * 128, [0.1 * (i % 10) for i in range(128)]]
    (answer,) = handler.handle([{"body": json.dumps({"instances": x}).encode()}], None)
    with torch.inference_mode():
        ctr, _ = CalibratedNet(net, calibrator)(torch.tensor(x))
    assert answer == {"predictions": ctr.tolist()}
