"""A predict's route: which version answers it, where a failure runs again, whether it is shadowed, and why.

Routes that do not depend on the request are made once, when the versions, labels, shares or breakers change,
and handed out as they are (serving/routing/router.py): a tuple, so one costs nothing per request.
"""

from __future__ import annotations

from typing import NamedTuple

from serving.runtime.servable import LoadedVersion

# How an unlabelled request's version was chosen: the only kinds that are split, shadowed and fall back.
ROUTED = ("stable", "latest", "canary")


class Route(NamedTuple):
    """One request's route (never changed: a new Route is made for a fallback or a retry)."""

    primary: LoadedVersion  # the version that runs the request
    # The last good version when the route was made (serving/routing/fallback.py): a routed request that fails
    # on `primary` runs once more on the last good version then (versions may have come and gone meanwhile).
    # None: a failure is answered as it is (a version or label the client named, the retry itself, no breakers).
    retry: LoadedVersion | None
    shadow: bool  # whether the `shadow` label's version also scores it, off the client's path
    why: str  # "stable", "latest" or "canary" (ROUTED); "version" or "label" for one the client named
    fallback: str | None = (
        None  # why the last good version answers instead (a breaker's reason), None: it does not
    )
