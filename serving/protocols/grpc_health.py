"""`grpc.health.v1.Health` (Check and Watch, grpcio-health-checking's servicer) on the gRPC port.

The overall service ("") is SERVING when every configured model has an available version, and each model
name is a service of its own; both turn NOT_SERVING while the server drains. Statuses are refreshed every
`REFRESH_S` from the predictors (a Watch sees a change at most that late).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import OVERALL_HEALTH, aio

from serving.dataplane.predictor import Predictor

REFRESH_S = 0.25
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthReporter:
    """Keeps the health servicer's statuses equal to the models' availability."""

    def __init__(self, predictors: Callable[[], dict[str, Predictor]]) -> None:
        self.predictors = predictors
        self.servicer = aio.HealthServicer()
        self._reported: dict[str, int] = {}

    def register(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def refresh(self) -> None:
        """Set each model's status and the overall one; forget models no longer configured."""
        predictors = self.predictors()
        statuses = {
            name: SERVING if p.manager.latest is not None and not p.draining else NOT_SERVING
            for name, p in predictors.items()
        }
        overall = SERVING if statuses and all(s == SERVING for s in statuses.values()) else NOT_SERVING
        statuses[OVERALL_HEALTH] = overall
        for name, status in statuses.items():
            if self._reported.get(name) != status:
                await self.servicer.set(name, status)
                self._reported[name] = status
        for name in set(self._reported) - set(statuses):
            await self.servicer.set(name, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            del self._reported[name]

    async def run(self) -> None:
        """Refresh forever (cancel to stop)."""
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH_S)

    async def shut_down(self) -> None:
        """Every service NOT_SERVING from now on (grpcio-health-checking's graceful shutdown)."""
        await self.servicer.enter_graceful_shutdown()
