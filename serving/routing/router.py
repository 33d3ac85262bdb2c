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
every time, no draw, no lookup beyond the request's own fields.
"""

from __future__ import annotations

from ctr_contract.traffic import TrafficSplit
from serving.errors import InvalidArgument, NotFound, Unavailable
from serving.observability.metrics import ServingMetrics
from serving.observability.request_log import server_made
from serving.routing.fallback import Fallback, FallbackOptions
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
        self.fallback = (
            Fallback(self, fallback, metrics) if fallback is not None and fallback.enabled else None
        )
        self._plain: Route | None = None  # every routed request's route, when nothing depends on the request
        self._base: Pair | None = None  # the stable (or latest) version's routes
        self._canary: Pair | None = None  # the canary's, when it is loaded and has a share
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
        key = None if request_id is None or server_made(request_id) else request_id
        pair = self._canary if self._canary is not None and self.traffic.canary(key) else self._base
        route = pair[1] if self.traffic.shadow_percent > 0 and self.traffic.shadow(key) else pair[0]
        if self.fallback is not None and route.primary.version in self._unclosed:
            return self.fallback.redirect(route)
        return route

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
    def versions_changed(self, loaded: dict[int, LoadedVersion], latest: LoadedVersion | None) -> None:
        """The repository loaded or retired a version: `loaded` is its dict of the versions that serve."""
        self.loaded, self.latest = loaded, latest
        self.refresh()

    def unloaded(self, version: int) -> None:
        """The repository unloaded `version` (after its last request): its breaker goes with it."""
        if self.fallback is not None:
            self.fallback.forget(version)

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
