"""Who runs what: this process's lease (its heartbeat says it is alive) and each agent's lease
(only its holder runs the agent's turns, and every write for a turn is fenced by its token)."""
from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable

from ...log import Conflict, Fence, Op
from ..store import Store

logger = logging.getLogger(__name__)
LEASE_MARGIN = 0.2  # of the lease's ttl (at most 1 s): an unrenewed lease's turn stops this long before it ends


def fenced_out(exc: BaseException) -> bool:
    """Whether a write was refused because this process no longer holds the lease it was made under."""
    return isinstance(exc, Conflict) and exc.reason == "fenced"


def process_lease(instance: str) -> str:
    return f"proc:{instance}"


class ProcessLease:
    """This process's lease, renewed by `heartbeat`; `exclusive`: the only engine on its storage
    (the embedded mode holds a lock on the data folder), so no lease is needed or waited for."""

    def __init__(self, store: Store, instance: str, ttl: float, exclusive: bool) -> None:
        self.store = store
        self.instance = instance
        self.ttl = ttl  # how long a dead process keeps its agents and running calls
        self.exclusive = exclusive
        self._held_until = 0.0  # loop time: when the lease last taken ends (counted from when it was asked)
        self.lapses = 0  # times the lease was taken again after it may have ended (others may have taken us for dead)

    @property
    def name(self) -> str:
        return process_lease(self.instance)

    async def take(self) -> None:
        asked = asyncio.get_running_loop().time()
        if await self.store.log.lease(self.name, self.instance, self.ttl, mark=True):  # its token fences nothing
            if self._held_until and asked >= self.surely_alive_until():
                self.lapses += 1  # renewed past its end (a pause, a partition): not alive all along
            self._held_until = asked + self.ttl

    def alive_since(self, lapses: int) -> Callable[[], float]:
        """`surely_alive_until`, for what began when `self.lapses` was `lapses`: past any later lapse of the
        lease (the process may have been taken for dead meanwhile, even if it holds the lease again), -inf."""
        return lambda: self.surely_alive_until() if self.lapses == lapses else -math.inf

    def surely_alive_until(self) -> float:
        """Loop time until which no other process can take this one for dead (a margin before its lease
        could end): what this process writes by then was not raced by a takeover. Forever when exclusive."""
        if self.exclusive:
            return math.inf
        return self._held_until - min(1.0, self.ttl * LEASE_MARGIN)

    async def release(self) -> None:
        await self.store.log.release(self.name, self.instance, mark=True)

    async def is_alive(self, instance: str) -> bool:
        """Whether the process `instance` still runs (holds its lease)."""
        if instance == self.instance:
            return True
        return not self.exclusive and await self.store.log.lease_holder(process_lease(instance)) is not None

    async def heartbeat(self, agents: Callable[[], Iterable[AgentLease]]) -> None:
        """Renew this process's lease and its agents' leases; a runner whose lease was lost stops."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.take()
                for lease in list(agents()):
                    await lease.renew()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("lease renewal failed")


class AgentLease:
    """One agent's lease, as held (or not) by this process.

    `on_gained` runs when the lease is taken or its token changed (the runner looks again);
    `on_lost` when it is lost (the runner cancels its LLM call: another process may take over).
    """

    def __init__(self, process: ProcessLease, world: str, agent: str, *,
                 on_gained: Callable[[], None], on_lost: Callable[[], None]) -> None:
        self.process = process
        self.world = world
        self.agent = agent
        self.holds = False
        self.fence = 0  # the lease's fencing token: every write for a turn carries it (see `fenced`)
        self._expiry: asyncio.TimerHandle | None = None  # stops the turn before an unrenewed lease ends
        self._on_gained = on_gained
        self._on_lost = on_lost

    @property
    def name(self) -> str:
        """Only the process holding this lease runs the agent's turns (one LLM turn at a time)."""
        return f"agent:{self.world}/{self.agent}"

    async def renew(self) -> None:
        process = self.process
        if process.exclusive:
            self.holds = True
            return
        loop, ttl = asyncio.get_running_loop(), process.ttl
        asked = loop.time()  # the lease runs from when we asked, not from when Redis answered
        token = await process.store.log.lease(self.name, process.instance, ttl, world=self.world)
        if not token:
            if self.holds:
                self.lose("another process took it")
            return
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = loop.call_at(asked + ttl - min(1.0, ttl * LEASE_MARGIN), self.lose,
                                    "it could not be renewed in time")
        if not self.holds or token != self.fence:
            self._on_gained()
        self.holds, self.fence = True, token

    def lose(self, why: str) -> None:
        """Stop running this agent's turn: another process may take it over (its writes are fenced anyway)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if not self.holds:
            return
        logger.warning("agent %s/%s: lease lost (%s); its turn stops here", self.world, self.agent, why)
        self.holds = False
        self._on_lost()

    def fenced(self, ops: list[Op]) -> list[Op]:
        """`ops` made conditional on still holding the lease (nothing to fence in the embedded mode)."""
        return ops if self.process.exclusive else [*ops, Fence(self.name, self.fence)]

    async def release(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        if self.holds and not self.process.exclusive:
            self.holds = False
            await self.process.store.log.release(self.name, self.process.instance, world=self.world)
