"""The breaker of one version (serving/routing/router.py, the rules in fallback.py) on explicit clocks: window,
threshold, half-open."""

from __future__ import annotations

import pytest

from serving.app.config import parse_config
from serving.errors import (
    DeadlineExceeded,
    InvalidArgument,
    NonFiniteOutput,
    Overloaded,
    ServingError,
    Unavailable,
)
from serving.routing.fallback import PROBE_SUCCESSES, FallbackOptions, failure_reason
from serving.routing.router import Breaker

OPTIONS = FallbackOptions(error_rate=0.5, min_requests=4, window_s=10.0, cooldown_s=30.0, probe_every=10)


def test_opens_at_the_rate_once_enough_outcomes_are_in_the_window() -> None:
    breaker = Breaker(OPTIONS)
    assert not breaker.record(100.0, "errors")
    assert not breaker.record(100.1, "errors")  # 2 of 2 failed, but fewer than 4 outcomes
    assert not breaker.record(100.2, None)
    assert breaker.state == "closed"
    assert breaker.record(100.3, "non_finite")  # 3 of 4 failed
    assert (breaker.state, breaker.reason) == ("open", "errors")  # the most frequent reason in the window


def test_below_the_rate_stays_closed() -> None:
    breaker = Breaker(OPTIONS)
    for i in range(30):
        breaker.record(100.0 + i * 0.01, "errors" if i % 3 == 2 else None)  # a third fail
    assert breaker.state == "closed"


def test_outcomes_older_than_the_window_are_forgotten() -> None:
    breaker = Breaker(OPTIONS)
    for i in range(3):
        breaker.record(100.0 + i, "errors")
    assert breaker.window(100.0 + 2) == (3, {"errors": 3})
    assert breaker.window(125.0)[0] == 0  # 25 s later nothing is left of them
    assert not breaker.record(125.0, "errors")  # 1 outcome in the window: below --fallback_min_requests
    assert breaker.state == "closed"


def test_half_open_probes_one_in_n_and_closes_after_good_probes() -> None:
    breaker = Breaker(OPTIONS)
    for i in range(4):
        breaker.record(100.0 + i * 0.1, "deadline")
    assert breaker.state == "open" and breaker.reason == "deadline"
    opened = breaker.opened_at
    assert not breaker.admits(opened + 29.9)  # cooling down
    admitted = [breaker.admits(opened + 30.0) for _ in range(20)]
    assert breaker.state == "half_open"
    assert admitted == [i % 10 == 0 for i in range(20)]  # the first and then every tenth
    for i in range(PROBE_SUCCESSES - 1):
        breaker.record(opened + 31 + i, None)
        assert breaker.state == "half_open"
    breaker.record(opened + 40, None)
    assert breaker.state == "closed" and breaker.reason == ""
    assert breaker.window(opened + 40) == (0, {})  # closed afresh: the old outcomes are gone


def test_a_failed_probe_opens_it_for_another_cooldown() -> None:
    breaker = Breaker(OPTIONS)
    for _ in range(4):
        breaker.record(100.0, "errors")
    assert breaker.admits(100.0 + 30.0)
    breaker.record(130.5, None)
    assert breaker.record(131.0, "non_finite")
    assert (breaker.state, breaker.reason, breaker.opened_at) == ("open", "non_finite", 131.0)
    assert not breaker.admits(131.0 + 29.0)
    assert breaker.admits(131.0 + 30.0)


def test_only_the_versions_faults_count() -> None:
    assert failure_reason(NonFiniteOutput("nan")) == "non_finite"
    assert failure_reason(DeadlineExceeded("queue")) == "deadline"
    assert failure_reason(Unavailable("unloaded")) == "unavailable"
    assert failure_reason(ServingError("model execution failed")) == "errors"
    assert failure_reason(RuntimeError("ONNX Runtime failed")) == "errors"
    assert failure_reason(InvalidArgument("bad row")) is None  # the client's mistake
    assert failure_reason(Overloaded("queue full")) is None  # load, not a broken version


def test_bad_flags_are_refused_with_their_names(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model_base_path=/tmp/none"]
    for flag, message in (
        ("--fallback_error_rate=1.5", "--fallback_error_rate must be in [0, 1], got 1.5"),
        ("--fallback_min_requests=0", "--fallback_min_requests and --fallback_probe_every must be >= 1"),
        ("--fallback_window_s=0", "--fallback_window_s must be > 0"),
    ):
        with pytest.raises(SystemExit):
            parse_config([*base, flag])
        assert message in capsys.readouterr().err
    assert parse_config([*base, "--fallback_error_rate=0"]).fallback_options().enabled is False
