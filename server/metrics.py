"""Prometheus metrics, one registry per server instance (so tests can run several)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600, 3600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.connections = Gauge("agent_world_connections", "Open WebSocket connections", registry=r)
        self.events = Counter("agent_world_events_total", "Events appended to the log", ["kind"], registry=r)
        self.pending = Gauge("agent_world_pending_approvals", "Approvals waiting for a decision", ["world"],
                             registry=r)
        self.approval_wait = Histogram("agent_world_approval_wait_seconds", "Request to decision",
                                       buckets=_SECONDS, registry=r)
        self.llm_latency = Histogram("agent_world_llm_seconds", "One LLM call, retries included",
                                     buckets=_SECONDS, registry=r)
        self.errors = Counter("agent_world_errors_total", "Errors by kind", ["kind"], registry=r)

    def llm_answered(self, seconds: float) -> None:
        self.llm_latency.observe(seconds)

    def llm_failed(self, world: str) -> None:
        self.errors.labels("llm").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
