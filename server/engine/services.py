"""What an agent's runner uses of the engine: the parts, not the whole `Engine` (no import circle)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..llm import Provider
from ..metrics import Metrics
from .approvals.deciding import Approvals
from .calls.executor import Executor, ToolLookup
from .hosting.leases import ProcessLease
from .store import Store
from .turns.budget import LLMBudget
from .world.status import StatusBoard
from .world.worlds import Worlds


@dataclass(frozen=True)
class Services:
    store: Store
    worlds: Worlds
    approvals: Approvals
    executor: Executor
    status: StatusBoard
    metrics: Metrics
    leases: ProcessLease  # this process's instance id, lease ttl, exclusive mode, and who else is alive
    tools_for: ToolLookup  # (world, agent) -> the tools it may call, by name
    provider_for: Callable[[dict[str, Any]], Provider]  # an agent's config -> its LLM provider
    llm_budget: LLMBudget = field(default_factory=LLMBudget)  # each world's LLM calls a minute, in this process
