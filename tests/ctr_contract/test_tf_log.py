"""One rule for TensorFlow's C++ log (ctr_contract/tf_log.py): quiet by default, the user's level kept, loud when asked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctr_contract.tf_log import LOG_LEVEL_ENV, quiet_tensorflow_log
from serving.app.config import parse_config


@pytest.fixture
def fresh_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    return monkeypatch


def test_quiet_by_default_sets_level_3(fresh_env: pytest.MonkeyPatch) -> None:
    assert quiet_tensorflow_log(verbose=False) is True
    assert os.environ[LOG_LEVEL_ENV] == "3"


def test_verbose_leaves_the_level_unset(fresh_env: pytest.MonkeyPatch) -> None:
    assert quiet_tensorflow_log(verbose=True) is False
    assert LOG_LEVEL_ENV not in os.environ


def test_the_users_own_level_is_kept(fresh_env: pytest.MonkeyPatch) -> None:
    fresh_env.setenv(LOG_LEVEL_ENV, "0")

    assert quiet_tensorflow_log(verbose=False) is False
    assert os.environ[LOG_LEVEL_ENV] == "0"


@pytest.mark.parametrize(
    ("flags", "level"),
    [(["--backend=tf"], "3"), (["--backend=tf", "--log_level=debug"], None), (["--backend=onnx"], None)],
)
def test_serving_quiets_tensorflow_only_for_the_tf_backend_unless_debug(
    fresh_env: pytest.MonkeyPatch, tmp_path: Path, flags: list[str], level: str | None
) -> None:
    parse_config(["--model_name=ctr", f"--model_base_path={tmp_path}", *flags])

    assert os.environ.get(LOG_LEVEL_ENV) == level
