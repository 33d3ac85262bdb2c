"""Training and export send a span per stage to a real OTLP receiver when the OTEL_* variables say so, under
the TRACEPARENT of the caller (scripts/daily.sh), so a day is one trace; without the variables nothing is
imported (ctr_contract/stage_trace.py, which both stages use)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.serving.otlp_receiver import OtlpReceiver

DAY_TRACE, DAY_SPAN = "5" * 32, "6" * 16
CODE = """
from ctr_contract.stage_trace import run, stage
with run("{name}", day=3):
    for s in {stages}:
        with stage(s):
            pass
import sys
print(sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")) != [])
"""


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.stop()


def _run(package: str, name: str, stages: list[str], env: dict[str, str]) -> str:
    code = CODE.format(stage=package, name=name, stages=stages)
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "TRACEPARENT"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_training_and_export_stages_are_one_trace_under_traceparent(receiver: OtlpReceiver) -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "TRACEPARENT": f"00-{DAY_TRACE}-{DAY_SPAN}-01",
    }
    assert _run("training", "training", ["prepare", "fit", "evaluate"], env) == "True"
    export_stages = ["prepare", "quality_gate", "onnx", "savedmodel", "parity", "raw_parity", "publish"]
    assert _run("export", "export", export_stages, env) == "True"
    spans = receiver.wait(lambda: (t := receiver.trace(DAY_TRACE)) and len(t) == 12 and t)
    roots = {s["name"]: s for s in spans if s["parent_span_id"] == DAY_SPAN}
    assert set(roots) == {"training", "export"}
    assert roots["training"]["service"] == "ctr-training" and roots["export"]["attributes"] == {"day": 3}
    for root, names in (("training", ["evaluate", "fit", "prepare"]), ("export", sorted(export_stages))):
        kids = [s["name"] for s in spans if s["parent_span_id"] == roots[root]["span_id"]]
        assert sorted(kids) == names


def test_without_the_variables_no_sdk_is_imported(receiver: OtlpReceiver) -> None:
    assert _run("training", "training", ["fit"], {}) == "False"
    assert _run(
        "export", "export", ["publish"], {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}
    ) == ("False")
