"""One model's routing: which loaded version answers each predict, by labels, the traffic split and the breakers.

A predict that names a version (`/versions/N`) or a label (`/labels/L`) gets that version, never split, never
shadowed, never redirected. One that names neither is routed: to the `stable` label's version when it is
loaded, else the latest loaded version; `canary_percent` of them to the `canary` label's version instead;
`shadow_percent` of them are also scored by the `shadow` label's version (ctr_contract/traffic.py has the split
rule and the `# ctr-traffic:` line); while the chosen version's circuit breaker is open, to the last good
version (serving/routing/fallback.py).

The repository pushes the loaded versions here whenever they change (`versions_changed`, from
serving/repository/manager.py), and the model config's labels and shares come with `configure`; each time,
the routes that do not depend on the request are made once (`refresh`). A predict then costs one of those
routes: with no split configured and the version's breaker closed, `route` returns the same Route object
every time, no draw, no lookup beyond the request's own fields. The breakers are kept here too (`Breaker`, by
version), and a closed one counts a success here (`succeeded`); serving/routing/fallback.py judges the rest.
"""

from __future__ import annotations

import time
from collections import Counter
from random import random

from ctr_contract.traffic import TrafficSplit
from serving.errors import InvalidArgument, NotFound, Unavailable
from serving.observability.metrics import ServingMetrics
from serving.observability.request_log import server_made
from serving.routing.fallback import BUCKETS, PROBE_SUCCESSES, Fallback, FallbackOptions
from serving.routing.route import Route
from serving.runtime.servable import LoadedVersion

SHADOW_LABEL = "shadow"
Pair = tuple[Route, Route]  # the same route unshadowed and shadowed


class Router:
    """The routes of one model's predicts, remade whenever its versions, labels, shares or breakers change."""

    def __init__(
        self,
        name: str,
        labels: dict[str, int],
        metrics: ServingMetrics,
        traffic: TrafficSplit | None = None,
        default_traffic: TrafficSplit | None = None,
        fallback: FallbackOptions | None = None,
    ) -> None:
        """`traffic`: the model's `# ctr-traffic:` shares (None: `default_traffic`, the `--canary_percent` and
        `--shadow_percent` flags' shares, none split when None too); `fallback`: the breakers' options (None or
        an error rate of 0: no breakers, a failure is answered as it is)."""
        self.name, self.labels = name, labels
        self.default_traffic = default_traffic or TrafficSplit()
        self.traffic = traffic or self.default_traffic
        self.loaded: dict[int, LoadedVersion] = {}  # the repository's own dict, pushed by `versions_changed`
        self.latest: LoadedVersion | None = None
        self.breakers: dict[int, Breaker] = {}  # by version, made at its first outcome (`breaker`)
        self.fallback = (
            Fallback(self, fallback, metrics) if fallback is not None and fallback.enabled else None
        )
        self._plain: Route | None = None  # every routed request's route, when nothing depends on the request
        self._base: Pair | None = None  # the stable (or latest) version's routes
        self._canary: Pair | None = None  # the canary's, when it is loaded and has a share
        self._canary_share = 0.0  # its share of the requests without a client id, 0 to 1
        self._unclosed: frozenset[int] = frozenset()  # versions whose breaker is not closed
        self._by_version: dict[int, Route] = {}
        self._by_label: dict[str, Route] = {}
        self.refresh()

    # --- request path -------------------------------------------------------------------------
    def route(self, name: str, version: int | None, label: str | None, request_id: str | None) -> Route:
        """The route of one predict; NotFound / InvalidArgument / Unavailable when there is none.

        `request_id`: the request's id, hashed by the split (an id the server made draws at random).
        """
        if version is not None or label is not None or name != self.name:
            named = self._by_label.get(label) if label is not None else self._by_version.get(version or 0)
            if named is not None and name == self.name:
                return named
            return Route(
                self.resolve(name, version, label), None, False, "version" if label is None else "label"
            )
        if self._plain is not None:
            return self._plain
        return self._routed(request_id)

    def _routed(self, request_id: str | None) -> Route:
        """A routed request's route when the split or a breaker is involved."""
        if self._base is None:
            raise Unavailable(
                f"Servable not found for request: Latest({self.name}); no version is loaded yet"
            )
        if request_id is None or server_made(request_id):  # no client id: a random choice, drawn here
            pair = self._canary if self._canary is not None and random() < self._canary_share else self._base
            key = None
        else:
            key = request_id
            pair = self._canary if self._canary is not None and self.traffic.canary(key) else self._base
        route = pair[1] if self.traffic.shadow_percent > 0 and self.traffic.shadow(key) else pair[0]
        if self.fallback is not None and route.primary.version in self._unclosed:
            return self.fallback.redirect(route)
        return route

    def succeeded(self, version: int, deadline: float | None) -> None:
        """A run of `version` answered (breakers on). A closed breaker counts the success here, which changes
        no route; past `deadline`, or a breaker not closed (or not made yet), the fallback judges it."""
        now = time.monotonic()
        breaker = self.breakers.get(version)
        if (
            breaker is not None
            and breaker.state == "closed"
            and (deadline is None or now <= deadline)
            and version in self.loaded
        ):
            # `record(now, None)` of a closed breaker, at the fewest operations in the last outcome's bucket.
            if breaker.since <= now < breaker.until:
                breaker.totals[breaker.slot] += 1
            else:
                breaker.record(now, None)
            return
        if self.fallback is not None:
            self.fallback.succeeded(version, deadline)

    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> LoadedVersion:
        """The version a model spec names (unsplit: the `stable` label's, else the latest, for none);
        NotFound / InvalidArgument / Unavailable with TF Serving's messages."""
        if name != self.name:
            kind = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
            raise NotFound(f"Servable not found for request: {kind}")
        if label is not None:
            if label not in self.labels:
                raise InvalidArgument(f"Unrecognized servable version label: {label}")
            version = self.labels[label]
        if version is None:
            unlabelled = self.labelled("stable") or self.latest
            if unlabelled is None:
                raise Unavailable(
                    f"Servable not found for request: Latest({self.name}); no version is loaded yet"
                )
            return unlabelled
        servable = self.loaded.get(version)
        if servable is None:
            raise NotFound(f"Servable not found for request: Specific({name}, {version})")
        return servable

    def labelled(self, label: str) -> LoadedVersion | None:
        """The loaded version `label` names; None when the label is not set or its version is not loaded."""
        version = self.labels.get(label)
        return None if version is None else self.loaded.get(version)

    # --- changes ------------------------------------------------------------------------------
    def breaker(self, version: int) -> Breaker:
        """`version`'s breaker (serving/routing/fallback.py has the rules), made at its first outcome."""
        breaker = self.breakers.get(version)
        if breaker is None:
            assert self.fallback is not None, "no breakers: --fallback_error_rate is 0"
            # A version number reused after an unload starts afresh: forget versions no longer loaded.
            for gone in [v for v in self.breakers if v not in self.loaded]:
                del self.breakers[gone]
            breaker = self.breakers[version] = Breaker(self.fallback.options)
        return breaker

    def versions_changed(self, loaded: dict[int, LoadedVersion], latest: LoadedVersion | None) -> None:
        """The repository loaded or retired a version: `loaded` is its dict of the versions that serve."""
        self.loaded, self.latest = loaded, latest
        self.refresh()

    def unloaded(self, version: int) -> None:
        """The repository unloaded `version` (after its last request): its breaker goes with it."""
        self.breakers.pop(version, None)

    def configure(self, labels: dict[str, int], traffic: TrafficSplit | None) -> None:
        """New labels and shares from the model config file (`traffic` None: the flags' shares)."""
        self.labels, self.traffic = labels, traffic or self.default_traffic
        self.refresh()

    def refresh(self) -> None:
        """Make every route that does not depend on the request again, from the versions, labels, shares and
        breakers now. Nothing here may outlive a version's retirement: the routes are remade when it retires."""
        fallback = self.fallback
        self._unclosed = frozenset(v for v in self.loaded if fallback is not None and not fallback.closed(v))
        stable = self.labelled("stable")
        primary = stable or self.latest
        self._base = None if primary is None else self._pair(primary, "stable" if stable else "latest")
        canary = self.labelled("canary") if self.traffic.canary_percent > 0 else None
        self._canary = None if canary is None else self._pair(canary, "canary")
        self._canary_share = self.traffic.canary_percent / 100  # TrafficSplit.canary's draw without an id
        self._plain = None
        if (
            self._base is not None
            and not self.traffic.active
            and self._base[0].primary.version not in self._unclosed
        ):
            self._plain = self._base[0]
        self._by_version = {v: Route(s, None, False, "version") for v, s in self.loaded.items()}
        self._by_label = {
            label: Route(self.loaded[v], None, False, "label")
            for label, v in self.labels.items()
            if v in self.loaded
        }

    def _pair(self, primary: LoadedVersion, why: str) -> Pair:
        retry = None if self.fallback is None else self.fallback.fallback_for(primary.version)
        return Route(primary, retry, False, why), Route(primary, retry, True, why)


class Breaker:
    """One version's rolling window of outcomes and its state: "closed", "open" or "half_open"."""

    def __init__(self, options: FallbackOptions) -> None:
        self.options = options
        self.state = "closed"
        self.reason = ""  # why it opened: the most frequent failure reason in the window then
        self.opened_at = 0.0
        self.width = options.window_s / BUCKETS
        self._epochs = [-1] * BUCKETS  # the bucket number each slot holds now
        self.totals = [0] * BUCKETS
        # The last outcome's slot, and a span of time within its bucket (from that outcome to just short of the
        # bucket's end, where float rounding cannot yet give the next bucket number); empty when the window was
        # emptied. A success in it only adds to the slot's total (Router.succeeded).
        self.slot, self.since, self.until = 0, 0.0, 0.0
        self._failures: list[Counter[str]] = [Counter() for _ in range(BUCKETS)]
        self._ticks = 0  # routed requests seen while half-open
        self._probe_successes = 0

    def _slot(self, now: float) -> int:
        epoch = int(now / self.width)
        slot = epoch % BUCKETS
        if self._epochs[slot] != epoch:
            self._epochs[slot], self.totals[slot] = epoch, 0
            self._failures[slot].clear()
        self.slot, self.since, self.until = slot, now, (epoch + 1) * self.width * (1 - 1e-12)
        return slot

    def _reset(self) -> None:
        self._epochs = [-1] * BUCKETS
        self.until = 0.0

    def window(self, now: float) -> tuple[int, Counter[str]]:
        """(outcomes, failures by reason) over the last --fallback_window_s."""
        current, total, failures = int(now / self.width), 0, Counter[str]()
        for slot in range(BUCKETS):
            if current - BUCKETS < self._epochs[slot] <= current:
                total += self.totals[slot]
                failures.update(self._failures[slot])
        return total, failures

    def record(self, now: float, reason: str | None) -> bool:
        """Count one outcome (`reason` None: a success); True when this outcome opened the breaker."""
        slot = self._slot(now)
        self.totals[slot] += 1
        if reason is None:
            if self.state == "half_open":
                self._probe_successes += 1
                if self._probe_successes >= PROBE_SUCCESSES:
                    self.state, self.reason = "closed", ""
                    self._reset()
            return False
        self._failures[slot][reason] += 1
        if self.state == "half_open":  # a failed probe: another cool-down
            self._open(now, reason)
            return True
        if self.state == "open":
            return False
        total, failures = self.window(now)
        failed = sum(failures.values())
        if total >= self.options.min_requests and failed >= self.options.error_rate * total:
            self._open(now, max(failures, key=lambda r: (failures[r], r == reason)))
            return True
        return False

    def _open(self, now: float, reason: str) -> None:
        self.state, self.reason, self.opened_at = "open", reason, now
        self._probe_successes = self._ticks = 0
        self._reset()

    def admits(self, now: float) -> bool:
        """Whether a routed request may run on this version now (half-open: one in --fallback_probe_every)."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if now - self.opened_at < self.options.cooldown_s:
                return False
            self.state, self._ticks, self._probe_successes = "half_open", 0, 0
        self._ticks += 1
        return self._ticks % self.options.probe_every == 1 % self.options.probe_every
