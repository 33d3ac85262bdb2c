"""The controller's Prometheus metrics (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

ACTIONS = ("adopt", "load", "shadow", "canary", "promote", "rollback")


class RolloutMetrics:
    """Decisions by action, and where the rollout of each model stands."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.decisions = Counter(
            "ctr_rollout_decisions_total", "Rollout decisions by action", ["model", "action"], registry=r
        )
        self.canary_percent = Gauge(
            "ctr_rollout_canary_percent",
            "Share of unlabelled requests sent to the canary",
            ["model"],
            registry=r,
        )
        self.shadow_percent = Gauge(
            "ctr_rollout_shadow_percent",
            "Share of unlabelled requests also scored by the shadow",
            ["model"],
            registry=r,
        )
        self.stable_version = Gauge(
            "ctr_rollout_stable_version", "The stable label's version (0: none yet)", ["model"], registry=r
        )
        self.candidate_version = Gauge(
            "ctr_rollout_candidate_version", "The version being rolled out (0: none)", ["model"], registry=r
        )

    def start(self, model: str, decisions: list[dict[str, object]]) -> None:
        """Create every series at 0, then count the journal's decisions (so the counter equals the journal)."""
        for action in ACTIONS:
            self.decisions.labels(model, action)
        for record in decisions:
            self.decisions.labels(model, str(record["action"])).inc()

    def show(
        self, model: str, stable: int | None, candidate: int | None, target: dict[str, object] | None
    ) -> None:
        self.stable_version.labels(model).set(stable or 0)
        self.candidate_version.labels(model).set(candidate or 0)
        shares = target or {}
        self.canary_percent.labels(model).set(float(shares.get("canary_percent", 0.0)))  # type: ignore[arg-type]
        self.shadow_percent.labels(model).set(float(shares.get("shadow_percent", 0.0)))  # type: ignore[arg-type]
