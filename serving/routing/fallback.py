"""Circuit breaking per version: a version that fails answers no routed request; the last good version does.

Each loaded version of a model has a breaker over a short rolling window (`--fallback_window_s`, in ten
buckets). It counts the version's outcomes: successes, and failures by reason:
    errors      the backend failed (an exception, a 500 that is not the client's doing);
    non_finite  the model's output was NaN or infinite for an input the API accepted
                (serving/dataplane/output_check.py; an input far outside the training ranges is the client's
                400 and counts nothing);
    deadline    the run finished after the request's deadline, was cut by it, or waited past the batching
                queue's deadline (`--rest_api_timeout_in_ms`);
    unavailable the version answered UNAVAILABLE (503) while it ran the request.
Client mistakes (4xx), a full batching queue (429) and a deadline that passed before the work started count
nothing. Once at least `--fallback_min_requests` outcomes in the window hold a share of failures of at least
`--fallback_error_rate`, the breaker opens, named after the most frequent reason in the window.

While it is open, routed requests (no explicit version or label: those the stable label, the latest rule or
the canary split chose) are answered by the last good version, `fallback_for`: the `stable` label's version
when it is loaded, not this one and closed, else the newest other loaded version whose breaker is closed.
Requests for `/versions/N` or `/labels/L` are never redirected (the client chose the version), but their
outcomes count. After `--fallback_cooldown_s` the breaker is half-open: one routed request in
`--fallback_probe_every` goes back to the version; PROBE_SUCCESSES successes in a row close it, a failure opens
it again for another cool-down. A routed request whose version fails (errors, non_finite, unavailable) is also
retried once on the last good version instead of answering the error. With no last good version, the
version answers as it would without a breaker, and its errors are returned.

An answer from the last good version carries the reason (`Prediction.fallback`; the REST header
`x-ctr-fallback`, gRPC trailing metadata) and counts `ctr_serving_fallbacks_total{model_name,version,reason}`
(version: the broken one). The breakers live on one worker's event loop: with `--num_workers N` each worker
judges the versions on its own traffic, and the counter adds up over the workers. docs/serving-fallback.md has
the rules and the flags.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from serving.errors import DeadlineExceeded, DeadlinePassed, NonFiniteOutput, ServingError, Unavailable
from serving.observability.metrics import ServingMetrics
from serving.routing.route import Route
from serving.runtime.servable import LoadedVersion

log = logging.getLogger(__name__)
BUCKETS = 10  # the rolling window's buckets: it slides by a tenth of --fallback_window_s
PROBE_SUCCESSES = 3  # successful probes in a row that close a half-open breaker
RETRIED = (
    "errors",
    "non_finite",
    "unavailable",
)  # a routed request failing so is retried on the last good one


@dataclass(frozen=True)
class FallbackOptions:
    """The breaker's flags (serving/app/config.py); `error_rate` 0 turns breaking and retries off."""

    error_rate: float = 0.5
    min_requests: int = 5
    window_s: float = 10.0
    cooldown_s: float = 30.0
    probe_every: int = 10

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"--fallback_error_rate must be in [0, 1], got {self.error_rate}")
        if self.min_requests < 1 or self.probe_every < 1:
            raise ValueError(
                f"--fallback_min_requests and --fallback_probe_every must be >= 1, got {self.min_requests} "
                f"and {self.probe_every}"
            )
        if not (self.window_s > 0 and self.cooldown_s >= 0):
            raise ValueError(
                f"--fallback_window_s must be > 0 and --fallback_cooldown_s >= 0, got {self.window_s} and "
                f"{self.cooldown_s}"
            )

    @property
    def enabled(self) -> bool:
        return self.error_rate > 0


def failure_reason(exc: BaseException) -> str | None:
    """The breaker's reason for a failed run of a version; None when the version is not at fault."""
    if isinstance(exc, DeadlinePassed):
        return None
    if isinstance(exc, NonFiniteOutput):
        return "non_finite"
    if isinstance(exc, DeadlineExceeded):
        return "deadline"
    if isinstance(exc, Unavailable):
        return "unavailable"
    if isinstance(exc, ServingError):
        return "errors" if exc.http_status >= 500 else None  # 4xx: the client's mistake or 429's load
    return "errors" if isinstance(exc, Exception) else None  # a backend exception; cancellation is not


class Breaker(Protocol):
    """What the fallback reads and feeds of one version's breaker (serving/routing/router.py's `Breaker`)."""

    state: str  # "closed", "open" or "half_open"
    reason: str  # why it opened

    def record(self, now: float, reason: str | None) -> bool:
        """Count one outcome (`reason` None: a success); True when this outcome opened the breaker."""

    def admits(self, now: float) -> bool:
        """Whether a routed request may run on this version now."""


class Routes(Protocol):
    """What the breakers judge by, and where they are kept (serving/routing/router.py's Router)."""

    name: str
    loaded: dict[int, LoadedVersion]  # the versions that serve now
    labels: dict[str, int]

    @property
    def breakers(self) -> Mapping[int, Breaker]:
        """The breakers by version, each made at its version's first outcome (`breaker`)."""

    def breaker(self, version: int) -> Breaker:
        """`version`'s breaker, made now if it has none."""

    def refresh(self) -> None:
        """Remake the routes: a breaker closed or opened."""


class Fallback:
    """One model's judging of its breakers' outcomes and its choice of the last good version.

    The router (serving/routing/router.py) owns it and keeps the breakers: the loaded versions and labels are
    the router's, a closed breaker's success is counted there, and a breaker that closes or opens makes the
    router remake its routes (`Router.refresh`).
    """

    def __init__(self, router: Routes, options: FallbackOptions, metrics: ServingMetrics) -> None:
        self.router, self.options, self.metrics = router, options, metrics
        self.name = router.name

    def closed(self, version: int) -> bool:
        breaker = self.router.breakers.get(version)
        return breaker is None or breaker.state == "closed"

    def fallback_for(self, broken: int) -> LoadedVersion | None:
        """The last good version: the stable label's when loaded, not `broken` and closed, else the newest
        other loaded version whose breaker is closed; None when there is none."""
        loaded = self.router.loaded
        stable = self.router.labels.get("stable")
        if stable is not None and stable != broken and stable in loaded and self.closed(stable):
            return loaded[stable]
        for version in sorted(loaded, reverse=True):
            if version != broken and self.closed(version):
                return loaded[version]
        return None

    def redirect(self, route: Route) -> Route:
        """`route` when its version's breaker admits it (closed, or half-open and its turn to probe), else the
        route to the last good version, with the breaker's reason (`route` when there is none)."""
        breaker = self.router.breakers.get(route.primary.version)
        if breaker is None or breaker.state == "closed" or breaker.admits(time.monotonic()):
            return route
        target = self.fallback_for(route.primary.version)
        if target is None:
            return route
        self.metrics.fallbacks.inc(self.name, str(route.primary.version), breaker.reason)
        return Route(target, self.fallback_for(target.version), route.shadow, route.why, breaker.reason)

    def succeeded(self, version: int, deadline: float | None) -> None:
        """A run of `version` answered; past `deadline` it counts as a deadline miss. (`Router.succeeded` counts
        a closed breaker's success in time itself.)"""
        now = time.monotonic()
        self._record(version, now, "deadline" if deadline is not None and now > deadline else None)

    def failed(self, route: Route, exc: BaseException, deadline: float | None) -> Route | None:
        """Count a failed run of `route`'s version; returns the route of the run once more (None: the error
        is answered). Only a route with a `retry` runs again, for a reason in RETRIED, before its deadline, on
        the last good version now. A cancelled run (gRPC) whose deadline has passed is a deadline miss."""
        version, now = route.primary.version, time.monotonic()
        reason = failure_reason(exc)
        if reason is None and not isinstance(exc, Exception) and deadline is not None and now >= deadline:
            reason = "deadline"
        if reason is not None:
            self._record(version, now, reason)
        if route.retry is None or reason not in RETRIED or (deadline is not None and now >= deadline):
            return None
        target = self.fallback_for(version)
        if target is None:
            return None
        self.metrics.fallbacks.inc(self.name, str(version), reason)
        return Route(target, None, route.shadow, route.why, reason)

    def _record(self, version: int, now: float, reason: str | None) -> None:
        if version not in self.router.loaded:  # retired, its last requests answering: judged no more
            return
        breaker = self.router.breaker(version)
        was = breaker.state
        opened = breaker.record(now, reason)
        if (was == "closed") != (breaker.state == "closed"):  # the routes and last good versions change
            self.router.refresh()
        if opened and was != "half_open":
            target = self.fallback_for(version)
            log.warning(
                "%s version %d: circuit open (%s); routed requests go to the last good version (%s) for %gs, "
                "then 1 in %d to this one",
                self.name,
                version,
                breaker.reason,
                "none" if target is None else target.version,
                self.options.cooldown_s,
                self.options.probe_every,
            )
        elif was == "half_open" and breaker.state == "open":
            log.info(
                "%s version %d: a probe failed (%s); open for another %gs",
                self.name,
                version,
                reason,
                self.options.cooldown_s,
            )
        elif was == "half_open" and breaker.state == "closed":
            log.info(
                "%s version %d: circuit closed after %d good probes",
                self.name,
                version,
                PROBE_SUCCESSES,
            )
