"""Command line: TF Serving's flag spellings parse, bad values fail with a message, the curl example works."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.app.config import parse_config
from serving.repository.policy import VersionPolicy
from tests.helpers import REPO_ROOT
from tests.serving.server_process import ServerProcess


def test_classic_tf_serving_line_parses_as_written() -> None:
    cfg = parse_config(["--rest_api_port=8501", "--model_name=ctr", "--model_base_path=/models/ctr/"])
    assert (cfg.port, cfg.rest_api_port, cfg.model_name, cfg.model_base_path) == (
        8500,
        8501,
        "ctr",
        Path("/models/ctr"),
    )
    assert (cfg.backend, cfg.enable_batching, cfg.model_version_policy) == (
        "onnx",
        False,
        VersionPolicy("latest", 1),
    )


@pytest.mark.parametrize(
    ("flag", "expected"),
    [("--enable_batching", True), ("--enable_batching=true", True), ("--enable_batching=false", False)],
)
def test_gflags_style_booleans(flag: str, expected: bool) -> None:
    assert parse_config(["--model_base_path=/m", flag]).enable_batching is expected


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            "--model_version_policy=newest",
            "bad version policy 'newest'; expected latest:N (N>=1), all, or specific:V1,V2,...",
        ),
        ("--max_batch_size=0", "--max_batch_size must be >= 1, got 0"),
        ("--rest_api_port=70000", "--rest_api_port must be a TCP port in 0..65535, got 70000"),
        ("--version_labels=stable", "expected LABEL=VERSION pairs such as stable=1, got 'stable'"),
    ],
)
def test_bad_flag_values_exit_2_with_a_message(flag: str, message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "serving", "--model_base_path=/m", flag],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr


def test_print_curl_example_prints_a_working_command(model_repo: Path, tmp_path: Path) -> None:
    server = ServerProcess(model_repo, tmp_path / "server.log", "--print_curl_example")
    try:
        server.wait_ready()
        deadline = time.monotonic() + 10
        while "curl -s" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        log = server.log()
        command = log[log.index("curl -s") : log.index("}'", log.index("curl -s")) + 2]
        out = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        assert out.startswith('{"predictions":[[') and out.endswith("]]}")
    finally:
        assert server.stop() == 0
