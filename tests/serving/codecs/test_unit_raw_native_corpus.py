"""The fuzzing regression corpus (fuzz/corpus/, every input that ever crashed kept there) on the normal build:
each file fed to its target (fuzz/targets.py), which checks the native answer against the exact path or a
plain Python reference. `make fuzz` replays the same files under ASan + UBSan first."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.targets import NAMES, TARGETS
from serving.codecs import raw_body
from tests.helpers import REPO_ROOT

CORPUS = REPO_ROOT / "fuzz" / "corpus"
FILES = sorted(p for t in NAMES for p in (CORPUS / t).glob("*") if p.is_file())
pytestmark = pytest.mark.skipif(not raw_body.NATIVE, reason="the native extensions are not built")


def test_every_target_has_a_corpus() -> None:
    assert {p.parent.name for p in FILES} == set(NAMES)


@pytest.mark.parametrize("target", NAMES)
def test_the_corpus_replays_without_a_crash_or_a_mismatch(target: str) -> None:
    files: list[Path] = [p for p in FILES if p.parent.name == target]
    for path in files:
        TARGETS[target](path.read_bytes())  # an AssertionError names the mismatch
