"""Export records the training range of every model input (assets.extra/feature_ranges.json); a real exported
version served with it answers an absurd input (-3e38 in every feature) with a 400 naming it, not a 500."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ctr_contract.repository import FEATURE_RANGES_PATH
from export.errors import InputError
from export.publish.feature_ranges import write_ranges
from tests.conftest import Published
from tests.serving.server_process import ServerProcess, http


def test_the_version_holds_the_range_of_its_validation_rows(published: Callable[..., Published]) -> None:
    version = published("relu")
    doc = json.loads((version.version_dir / FEATURE_RANGES_PATH).read_text())
    val = np.load(version.run / "val_features.npy")
    assert doc["rows"] == len(val) and doc["source"] == f"validation rows ({len(val)})"
    assert [f["min"] for f in doc["features"]] == val.min(axis=0).tolist()
    assert [f["max"] for f in doc["features"]] == val.max(axis=0).tolist()
    assert [f["name"] for f in doc["features"][:2]] == ["I1", "I2"] and doc["features"][-1][
        "name"
    ].startswith("hash_")


def test_ranges_join_the_training_sample_and_the_validation_rows(tmp_path: Path) -> None:
    val = np.array([[0.0, 1.0], [2.0, -1.0]], np.float32)
    np.save(tmp_path / "train_features_sample.npy", np.array([[-5.0, 0.5]], np.float32))
    assert write_ranges(tmp_path / "r.json", tmp_path / "train_features_sample.npy", val)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [(f["min"], f["max"]) for f in doc["features"]] == [(-5.0, 2.0), (-1.0, 1.0)]
    assert doc["rows"] == 3 and "1 training rows" in doc["source"]
    np.save(tmp_path / "bad.npy", np.array([[np.inf, 0.0]], np.float32))
    with pytest.raises(InputError, match="expected finite float32"):
        write_ranges(tmp_path / "r.json", tmp_path / "bad.npy", val)


def test_an_exported_version_answers_an_absurd_input_with_a_400(
    published: Callable[..., Published], tmp_path: Path
) -> None:
    version = published("relu")
    server = ServerProcess(version.repo, tmp_path / "server.log")
    try:
        server.wait_ready()
        # This session model's output stays finite for +3e38 everywhere (sigmoid saturates to 0) and is NaN
        # for -3e38 (inf - inf in the second layer): the absurd row the test needs.
        rows = np.full((2, 128), -3e38, np.float32)
        rows[0] = 0.1
        status, body = http(server.url("/v1/models/ctr:predict"), {"instances": rows.tolist()})
        assert status == 400, body
        assert body["error"].startswith(
            "instance 1 feature 0 ('I1') is -3e+38, far outside the range seen in training"
        )
        status, body = http(server.url("/v1/models/ctr:predict"), {"instances": rows[:1].tolist()})
        assert status == 200 and np.isfinite(body["predictions"]).all()
    finally:
        server.stop()
