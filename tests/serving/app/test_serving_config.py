"""ServerConfig checks itself, so a config built by `dataclasses.replace` (workers.py) is checked like the CLI's."""

from __future__ import annotations

import dataclasses

import pytest

from serving.app.config import ServerConfig, parse_config

BASE = parse_config(["--model_base_path=/models/ctr"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_batch_size": 0}, "--max_batch_size must be >= 1, got 0"),
        ({"num_workers": -2}, "--num_workers must be >= 1, got -2"),
        ({"grace_period_seconds": -0.5}, "--grace_period_seconds must be >= 0, got -0.5"),
        ({"port": 65536}, "--port must be a TCP port in 0..65535, got 65536"),
        ({"rest_api_port": -1}, "--rest_api_port must be a TCP port in 0..65535, got -1"),
    ],
)
def test_replace_is_checked_like_the_command_line(change: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        dataclasses.replace(BASE, **change)
    assert str(caught.value) == message


def test_a_valid_replace_keeps_every_other_setting() -> None:
    moved = dataclasses.replace(BASE, port=9000, rest_api_port=0)
    assert isinstance(moved, ServerConfig)
    assert (moved.port, moved.rest_api_port) == (9000, 0)
    assert dataclasses.replace(moved, port=BASE.port, rest_api_port=BASE.rest_api_port) == BASE
