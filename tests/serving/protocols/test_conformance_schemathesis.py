"""schemathesis against our v2 REST API, from the OpenAPI description we wrote from the protocol's text (v2.yaml).

A real server on 127.0.0.1 serves a tiny repository (`ctr` with the `raw` signature, and the training ranges
export records, so `ctr` and `ctr_raw` are both v2 models). schemathesis runs its examples, coverage and fuzzing
phases with a bounded number of examples per operation and a fixed seed (deterministic generation, no example
database): every response must be no 5xx, a documented status code, the documented content type and headers,
and match the documented schema. The run's numbers (operations, test cases, failures) are printed and kept in
the JSON report under the test's tmp folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from ctr_contract.repository import FEATURE_RANGES_PATH
from export.publish.feature_ranges import write_ranges
from tests.serving.model_repo import write_manifest
from tests.serving.raw_model_repo import fit_spec, write_raw_version
from tests.serving.server_process import ServerProcess, env_without_proxy

pytestmark = pytest.mark.slow  # make test-slow: hundreds of generated requests

SPEC = Path(__file__).with_name("v2.yaml")
MAX_EXAMPLES = 50  # per operation and phase
SEED = 20261201  # recorded in the report; --generation-deterministic (derandomize) fixes the cases anyway
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
    "response_schema_conformance,unsupported_method,allow_header_conformance"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("conformance") / "ctr"
    version = write_raw_version(base, 1, fit_spec())
    rows = np.random.default_rng(1).normal(0, 1, (500, 128)).astype(np.float32)
    write_ranges(version / FEATURE_RANGES_PATH, None, rows)
    write_manifest(version, 1)
    proc = ServerProcess(base, base.parent / "server.log")
    proc.wait_ready()
    yield proc
    proc.stop()


def run_schemathesis(url: str, report: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`schemathesis run` (its CLI, as a user runs it) against `url`; the process and its JSON report."""
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        str(SPEC),
        f"--url={url}",
        f"--checks={CHECKS}",
        f"--max-examples={MAX_EXAMPLES}",
        f"--seed={SEED}",
        "--generation-deterministic",
        "--phases=examples,coverage,fuzzing",
        "--workers=1",
        "--request-timeout=10",
        "--no-color",
        "--report=json",
        f"--report-json-path={report}",
    ]
    # Run in the report's folder: schemathesis keeps a crash cache (.schemathesis/) in its working directory.
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=env_without_proxy(), cwd=report.parent
    )
    return done, json.loads(report.read_text()) if report.is_file() else {}


def test_v2_rest_conforms_to_its_openapi_description(server: ServerProcess, tmp_path: Path) -> None:
    done, report = run_schemathesis(server.url(""), tmp_path / "schemathesis.json")
    context = f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}\nserver log:\n{server.log()[-3000:]}"
    assert done.returncode == 0 and report, context
    operations, cases = report["operations"], report["test_cases"]
    print(
        f"schemathesis: {operations['tested']} operations, {cases['generated']} test cases, "
        f"{cases['with_failures']} with failures, {len(report['errors'])} errors"
    )
    assert operations["tested"] == operations["total"] == len(yaml_operations()), context
    assert (cases["with_failures"], cases["errored"], report["errors"]) == (0, 0, []), context
    assert cases["generated"] >= 10 * operations["total"], context  # the bound is reached, not skipped


def yaml_operations() -> list[str]:
    paths = yaml.safe_load(SPEC.read_text())["paths"]
    return [f"{m.upper()} {p}" for p, item in paths.items() for m in item if m in ("get", "post")]
