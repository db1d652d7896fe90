"""Prometheus metrics, one registry per server instance (so tests can run several)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from . import vocab
from .events import request_id

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
        # Kept by server/engine/world/usage.py from the replies in the log; kind: prompt, completion or total.
        self.tokens = Gauge("agent_world_tokens", "LLM tokens the agents' replies used, summed from the log",
                            ["world", "agent", "kind"], registry=r)
        self.watchers: list[Callable[[str, dict[str, Any]], None]] = []  # told of every event observed
        self._pending: dict[str, set[str]] = {}  # world -> ids of its pending approvals (kept from events)
        # Every refused write, spectators' included (theirs are counted here and never logged).
        self.refusals = Counter("agent_world_refusals_total", "Refused client writes by role and code",
                                ["role", "code"], registry=r)

    def pending_found(self, world: str, approval_ids: Iterable[str]) -> None:
        """The approvals already pending when this process started hosting `world`."""
        self._pending.setdefault(world, set()).update(approval_ids)
        self.pending.labels(world).set(len(self._pending[world]))

    def observe(self, world: str, event: dict[str, Any]) -> None:
        """Keep the pending gauge current from each event: a scrape then reads nothing."""
        for watch in self.watchers:
            watch(world, event)
        ids = self._pending.get(world)
        if event.get("kind") == vocab.WORLD_DELETED:
            if self._pending.pop(world, None) is not None:
                self.pending.remove(world)
        elif event.get("approval") and event.get("sender") == vocab.SERVER_SENDER and event.get("tool_calls"):
            self._pending.setdefault(world, set()).add(request_id(event))
        elif ids and event.get("role") == "tool" and event.get("tool_call_id") in ids \
                and (event.get("decision") or {}).get("final") is not False:  # one vote of several: still pending
            ids.discard(event["tool_call_id"])
        else:
            return
        if world in self._pending:
            self.pending.labels(world).set(len(self._pending[world]))

    def llm_answered(self, seconds: float) -> None:
        self.llm_latency.observe(seconds)

    def llm_failed(self, world: str) -> None:
        self.errors.labels("llm").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
