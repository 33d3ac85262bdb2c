"""serving/routing/router.py without a server: the real ModelManager loads two ONNX versions and tells the router.

Each route is checked by what it is (its version, retry, shadow choice, reason) and by what it costs: a route
that does not depend on the request is the same object every time, made again only when something changes.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ctr_contract.traffic import TrafficSplit, mix32
from serving.errors import InvalidArgument, NonFiniteOutput, NotFound, Unavailable
from serving.observability.metrics import ServingMetrics
from serving.observability.request_log import new_request_id
from serving.repository.manager import ModelManager
from serving.repository.policy import VersionPolicy
from serving.routing.fallback import FallbackOptions
from serving.routing.route import Route
from serving.routing.router import Router
from tests.serving.model_repo import make_weights, write_version

IDS = [f"r-{i}" for i in range(400)]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("repo") / "ctr"
    for version in (1, 2):
        write_version(base, version, make_weights(seed=version))
    return base


def run(
    base: Path, router: Router, test: Callable[[ModelManager], Awaitable[None]], policy: str = "all"
) -> None:
    """Versions 1 and 2 of `base` loaded by a ModelManager that tells `router`, then `test(manager)`."""

    async def main() -> None:
        with ThreadPoolExecutor(1) as disk:
            manager = ModelManager(
                "ctr", base, "onnx", 1, VersionPolicy(policy), ServingMetrics(), disk, router
            )
            await manager.poll_once()
            try:
                await test(manager)
            finally:
                for servable in manager.loaded.values():
                    servable.close()

    asyncio.run(main())


def canary(request_id: str, percent: float) -> bool:
    """The documented split, written out: mix32(crc32(b"canary:" + id)) < p / 100 * 2**32."""
    return mix32(zlib.crc32(b"canary:" + request_id.encode())) < percent / 100 * 2**32


def test_with_nothing_split_every_routed_request_gets_one_route_made_before(base: Path) -> None:
    router = Router("ctr", {"stable": 1}, ServingMetrics(), fallback=FallbackOptions())

    async def test(manager: ModelManager) -> None:
        first = router.route("ctr", None, None, "a")
        assert first == Route(
            manager.loaded[1], manager.loaded[2], False, "stable"
        )  # retry: the newest other
        assert all(router.route("ctr", None, None, rid) is first for rid in ("b", None, new_request_id()))
        named = router.route("ctr", 2, None, None)
        assert named == Route(manager.loaded[2], None, False, "version")
        assert router.route("ctr", 2, None, "x") is named
        assert router.route("ctr", None, "stable", None) == Route(manager.loaded[1], None, False, "label")
        router.configure({}, None)  # no stable label: the latest answers, a new route
        assert router.route("ctr", None, None, "a") == Route(
            manager.loaded[2], manager.loaded[1], False, "latest"
        )

    run(base, router, test)


def test_the_canary_share_follows_the_hash_and_the_shadow_share_is_marked(base: Path) -> None:
    split = TrafficSplit(canary_percent=30, shadow_percent=100)
    router = Router("ctr", {"stable": 1, "canary": 2, "shadow": 2}, ServingMetrics(), split)

    async def test(manager: ModelManager) -> None:
        routes = {rid: router.route("ctr", None, None, rid) for rid in IDS}
        assert {rid: r.why for rid, r in routes.items()} == {
            rid: "canary" if canary(rid, 30) else "stable" for rid in IDS
        }
        assert all(r.primary is manager.loaded[2 if r.why == "canary" else 1] for r in routes.values())
        assert all(r.shadow and r.retry is None and r.fallback is None for r in routes.values())
        # A version or label the client names is never split nor shadowed.
        assert router.route("ctr", 1, None, IDS[0]) == Route(manager.loaded[1], None, False, "version")
        assert router.route("ctr", None, "canary", IDS[0]) == Route(manager.loaded[2], None, False, "label")

    run(base, router, test)


def test_specs_that_name_nothing_served_get_tf_servings_errors(base: Path) -> None:
    router = Router("ctr", {"stable": 1, "gone": 9}, ServingMetrics())
    with pytest.raises(Unavailable, match=r"Latest\(ctr\); no version is loaded yet"):
        router.route("ctr", None, None, None)

    async def test(manager: ModelManager) -> None:
        cases = [
            ("nope", None, None, NotFound("Servable not found for request: Latest(nope)")),
            ("nope", 1, None, NotFound("Servable not found for request: Specific(nope, 1)")),
            ("ctr", 7, None, NotFound("Servable not found for request: Specific(ctr, 7)")),
            ("ctr", None, "canary", InvalidArgument("Unrecognized servable version label: canary")),
            ("ctr", None, "gone", NotFound("Servable not found for request: Specific(ctr, 9)")),
        ]
        for name, version, label, error in cases:
            with pytest.raises(type(error)) as caught:
                router.route(name, version, label, None)
            assert caught.value.message == error.message

    run(base, router, test)


def test_an_open_breaker_sends_routed_requests_to_the_last_good_version(base: Path) -> None:
    metrics = ServingMetrics()
    options = FallbackOptions(error_rate=0.5, min_requests=2, cooldown_s=3600)
    router = Router("ctr", {"stable": 2}, metrics, fallback=options)

    async def test(manager: ModelManager) -> None:
        stable = router.route("ctr", None, None, None)
        assert router.fallback is not None
        retry = router.fallback.failed(stable, NonFiniteOutput("nan"), None)
        assert retry == Route(manager.loaded[1], None, False, "stable", "non_finite")  # run once more there
        assert router.fallback.failed(retry, NonFiniteOutput("nan"), None) is None  # never twice
        assert router.fallback.failed(stable, NonFiniteOutput("nan"), None) is not None  # 2 of 2: open
        redirected = router.route("ctr", None, None, None)
        assert redirected == Route(manager.loaded[1], None, False, "stable", "non_finite")
        assert router.route("ctr", 2, None, None).primary is manager.loaded[2]  # the client's choice stands
        assert metrics.fallbacks.values[("ctr", "2", "non_finite")] == 3.0  # 2 retries, then 1 redirect

    run(base, router, test)


def test_a_closed_breaker_counts_successes_in_the_router_and_a_late_one_as_a_deadline_miss(
    base: Path,
) -> None:
    options = FallbackOptions(error_rate=0.5, min_requests=4, cooldown_s=3600)
    router = Router("ctr", {}, ServingMetrics(), fallback=options)

    async def test(manager: ModelManager) -> None:
        assert router.fallback is not None
        stable = router.route("ctr", None, None, None)
        assert stable.primary is manager.loaded[2]
        router.succeeded(2, None)  # the first outcome makes the breaker
        router.succeeded(2, None)  # then a closed breaker counts it where it is kept
        breaker = router.breakers[2]
        assert breaker.window(time.monotonic()) == (2, Counter())
        router.succeeded(2, time.monotonic() - 1)  # answered past its deadline: a deadline miss
        assert breaker.window(time.monotonic()) == (3, Counter({"deadline": 1}))
        router.succeeded(2, time.monotonic() - 1)  # 2 of 4 outcomes failed: open
        assert breaker.state == "open" and router.route("ctr", None, None, None).primary is manager.loaded[1]
        router.unloaded(2)  # an unloaded version's breaker goes with it
        assert 2 not in router.breakers

    run(base, router, test)


def test_a_retired_version_is_held_by_no_route(base: Path) -> None:
    router = Router("ctr", {}, ServingMetrics(), fallback=FallbackOptions())

    async def test(manager: ModelManager) -> None:
        assert router.route("ctr", None, None, None).primary is manager.loaded[2]
        gone = weakref.ref(manager.loaded[2])
        assert manager.change_policy(VersionPolicy("specific", versions=(1,)))
        await manager.poll_once()  # version 2 is retired and, idle, unloaded at once
        gc.collect()
        assert gone() is None
        assert router.route("ctr", None, None, None) == Route(manager.loaded[1], None, False, "latest")

    run(base, router, test)
