"""Bench test fixtures: the synthetic results dict of `bench_results.py`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.bench_results import make_results


@pytest.fixture
def results() -> dict[str, Any]:
    return make_results()
