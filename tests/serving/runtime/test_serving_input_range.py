"""An absurd input whose output is not finite is the client's 400, naming it; the model's own failure stays a 500.

One server, three models: `ctr` with the training ranges export records (assets.extra/feature_ranges.json),
`ctr_old` exported before ranges existed (the check is off: 500, logged once), and `ctr_bad` whose weights
overflow on inputs inside the ranges (a 500 however the input looks: the model is at fault).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ctr_contract.repository import FEATURE_RANGES_PATH
from export.publish.feature_ranges import build_ranges, write_ranges
from serving.runtime.input_range import RANGE_FACTOR, FeatureRanges
from tests.serving.model_repo import make_weights, write_manifest, write_onnx, write_warmup
from tests.serving.raw_model_repo import fit_spec, write_raw_version
from tests.serving.repository.test_serving_model_config import config_text
from tests.serving.server_process import ServerProcess, http
from training.synth import sample_rows

HUGE = 3e38  # finite in float32: every input check passes it, and the first layer overflows


def _training_rows(spec_seed: int = 3) -> np.ndarray:
    spec = fit_spec(spec_seed)
    numeric, ranks = sample_rows(np.random.default_rng(5), 2_000)
    categorical = np.char.mod("%08x", ranks % 40).astype(object)
    categorical[ranks < 0] = ""
    return spec.transform(numeric, categorical).astype(np.float32)


def _add_ranges(version_dir: Path, rows: np.ndarray) -> dict:
    """Write the ranges the way export does, then re-list the version's files in its manifest."""
    assert write_ranges(version_dir / FEATURE_RANGES_PATH, None, rows)
    write_manifest(version_dir, int(version_dir.name))
    return build_ranges(rows, "test")


@pytest.fixture(scope="module")
def ranges() -> dict:
    return build_ranges(_training_rows(), "test")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ranges")
    rows = _training_rows()
    _add_ranges(write_raw_version(root / "ctr", 1, fit_spec()), rows)
    write_raw_version(root / "ctr_old", 1, fit_spec())
    stage = root / "ctr_bad" / ".tmp-1"  # features only: a raw warm-up would overflow it at load
    (stage / "assets.extra").mkdir(parents=True)
    weights = make_weights(seed=11)
    weights[0] = np.full_like(weights[0], 1e38)  # any positive row overflows: inf, then inf - inf = NaN
    write_onnx(weights, stage / "model.onnx")
    write_warmup(stage / "assets.extra" / "tf_serving_warmup_requests", [np.zeros((1, 128), np.float32)])
    stage = stage.rename(stage.parent / "1")
    _add_ranges(stage, rows)
    config = root / "models.config"
    config.write_text(config_text({n: root / n for n in ("ctr", "ctr_old", "ctr_bad")}))
    proc = ServerProcess(None, root / "server.log", f"--model_config_file={config}")
    proc.wait_ready()
    for name in ("ctr_old", "ctr_bad"):
        proc.model_name = name
        proc.wait_ready()
    proc.model_name = "ctr"
    yield proc
    proc.stop()


def _rows() -> np.ndarray:
    rows = np.full((3, 128), HUGE, np.float32)
    rows[0] = 0.5
    return rows


def _nonfinite_count(server: ServerProcess, model: str) -> float:
    _, text = http(server.url("/metrics"))
    series = f'ctr_serving_nonfinite_outputs_total{{model_name="{model}"}} '
    values = [float(line[len(series) :]) for line in str(text).splitlines() if line.startswith(series)]
    return values[0] if values else 0.0


def _expected(ranges: dict, unit: str) -> str:
    lo, hi = ranges["features"][0]["min"], ranges["features"][0]["max"]
    return (
        f"{unit} 1 feature 0 ('I1') is 3e+38, far outside the range seen in training [{lo:g}, {hi:g}] (beyond "
        f"it by more than {RANGE_FACTOR:g} times its magnitude), and the model's output for it is nan (not "
        f"finite; 2 of 3 {unit}s); no prediction is returned: send features transformed as in training (the "
        "version's feature_spec.json), or raw fields to the raw signature"
    )


def test_v1_rest_absurd_input_is_a_400_naming_instance_feature_value_and_range(
    server: ServerProcess, ranges: dict
) -> None:
    before = _nonfinite_count(server, "ctr")
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": _rows().tolist()})
    assert (status, body) == (400, {"error": _expected(ranges, "instance")})
    assert _nonfinite_count(server, "ctr") == before  # the model did not fail: nothing pages its owner


def test_v2_rest_absurd_input_is_a_400(server: ServerProcess, ranges: dict) -> None:
    rows = _rows()
    request = {
        "inputs": [
            {"name": "features", "datatype": "FP32", "shape": list(rows.shape), "data": rows.ravel().tolist()}
        ]
    }
    status, body = http(server.url("/v2/models/ctr/infer"), request)
    assert (status, body) == (400, {"error": _expected(ranges, "instance")})


def test_v2_grpc_absurd_input_is_invalid_argument(server: ServerProcess, ranges: dict) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_target)
    tensor = grpcclient.InferInput("features", [3, 128], "FP32")
    tensor.set_data_from_numpy(_rows())
    with pytest.raises(InferenceServerException) as caught:
        client.infer("ctr", [tensor])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert caught.value.message() == _expected(ranges, "row")
    client.close()


def test_version_without_ranges_keeps_the_500_and_says_so_once(server: ServerProcess) -> None:
    before = _nonfinite_count(server, "ctr_old")
    status, body = http(server.url("/v1/models/ctr_old:predict"), {"instances": _rows().tolist()})
    assert status == 500 and body["error"].startswith("the model's output for instance 1 is nan")
    assert _nonfinite_count(server, "ctr_old") == before + 2
    assert server.log().count(f"ctr_old/1 has no {FEATURE_RANGES_PATH}") == 1


def test_nonfinite_output_from_in_range_input_stays_a_500_counted(server: ServerProcess) -> None:
    before = _nonfinite_count(server, "ctr_bad")
    status, body = http(server.url("/v1/models/ctr_bad:predict"), {"instances": [[0.5] * 128]})
    assert status == 500 and body["error"].startswith("the model's output for instance 0 is")
    assert _nonfinite_count(server, "ctr_bad") == before + 1
    # Absurd and ordinary rows together: one non-finite output the input does not explain keeps it a 500.
    status, _ = http(server.url("/v1/models/ctr_bad:predict"), {"instances": _rows().tolist()})
    assert status == 500


@pytest.mark.parametrize("count", [1e308, -1e308, 2.0**63, 1e38])
def test_raw_rows_with_huge_counts_are_a_400_naming_the_field(server: ServerProcess, count: float) -> None:
    """The server computes raw rows' features itself; a count beyond 2**53 never reaches the model."""
    instances = [{"I1": 3, "C1": "68fd1e64"}, {f"I{i}": count for i in range(1, 14)}]
    status, body = http(
        server.url("/v1/models/ctr:predict"), {"instances": instances, "signature_name": "raw"}
    )
    assert status == 400 and body["error"].startswith("instance 1 field 'I1' is "), body
    assert "counts must be within" in body["error"]
    request = {
        "inputs": [
            {"name": f"I{i}", "datatype": "FP64", "shape": [2], "data": [1.0, count]} for i in range(1, 14)
        ]
    }
    status, body = http(server.url("/v2/models/ctr_raw/infer"), request)
    assert status == 400 and "I1" in body["error"], body


@pytest.mark.parametrize("count", [2.0**53, -(2.0**53), 1e15])
def test_raw_rows_with_the_largest_counts_score_finite(server: ServerProcess, count: float) -> None:
    """Within the count limit the z-scores are clipped: the largest counts score like large ones."""
    instances = [{f"I{i}": count for i in range(1, 14)}, {"I1": 3, "C1": "68fd1e64"}]
    status, body = http(
        server.url("/v1/models/ctr:predict"), {"instances": instances, "signature_name": "raw"}
    )
    assert status == 200 and np.isfinite(body["predictions"]).all(), body
    request = {
        "inputs": [
            {"name": f"I{i}", "datatype": "FP64", "shape": [2], "data": [count, 1.0]} for i in range(1, 14)
        ]
    }
    status, body = http(server.url("/v2/models/ctr_raw/infer"), request)
    assert status == 200 and np.isfinite(body["outputs"][0]["data"]).all(), body


def test_raw_rows_with_infinite_counts_in_binary_are_a_400(server: ServerProcess) -> None:
    """Binary FP64 (gRPC contents, REST binary data) can carry inf, which JSON cannot: a 400 naming the field."""
    message = "row 0 field 'I1' is Infinity, out of range; counts must be within ±9007199254740992 (2**53)"
    values = np.array([np.inf, -np.inf])
    client = grpcclient.InferenceServerClient(server.grpc_target)
    tensor = grpcclient.InferInput("I1", [2], "FP64")
    tensor.set_data_from_numpy(values)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("ctr_raw", [tensor])
    assert (caught.value.status(), caught.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    client.close()
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    tensor = httpclient.InferInput("I1", [2], "FP64")
    tensor.set_data_from_numpy(values, binary_data=True)
    with pytest.raises(InferenceServerException) as caught:
        rest.infer("ctr_raw", [tensor])
    assert (caught.value.status(), caught.value.message()) == ("400", message)
    rest.close()


def test_ranges_are_read_with_the_version_and_a_broken_file_turns_the_check_off(tmp_path: Path) -> None:
    rows = np.array([[0.0, -2.0], [1.0, 3.0]], np.float32)
    assert write_ranges(tmp_path / FEATURE_RANGES_PATH, None, rows)
    ranges = FeatureRanges.load(tmp_path, 2)
    assert ranges is not None and ranges.names == ["I1", "I2"]
    assert ranges.lo.tolist() == [0.0, -2.0] and ranges.hi.tolist() == [1.0, 3.0]
    features = np.array([[1000.0, 3002.0], [1001.5, 0.0]], np.float32)  # margins: 1000 x 1 and 1000 x 3
    scores = np.full((2, 1), np.nan, np.float32)
    assert ranges.explain(features, np.array([True, False]), scores, "instance") is None
    error = ranges.explain(features, np.array([False, True]), scores, "instance")
    assert error is not None and error.message.startswith("instance 1 feature 0 ('I1') is 1001.5")
    assert FeatureRanges.load(tmp_path, 3) is None  # another width: off
    (tmp_path / FEATURE_RANGES_PATH).write_text("{")
    assert FeatureRanges.load(tmp_path, 2) is None
    assert not write_ranges(tmp_path / "none.json", None, None)
