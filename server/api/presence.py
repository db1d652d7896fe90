"""Who is connected to a world right now, across every process, published as `presence` frames (PROTOCOL §6).

Each process knows its own connections. In the distributed mode it also tells the others about
them on the bus (`PRESENCE_CHANNEL`): at every change, every `heartbeat` seconds, and when a new
process says hello. What another process said is kept until it says goodbye or goes quiet for
`ttl` seconds (a killed process says nothing), so a member list is the sum over live processes.

Presence is live state, not history: it is never written to the event log.

One process publishes each world's `presence` frame: the *leader*, the live process with the
smallest instance id among those holding connections to that world. Every process sees the
same announcements, so they agree on the leader and each change is told once, by whoever
learns of it — the leader learns of a change elsewhere from that process's announcement.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

import orjson

from ..aio import cancel_and_wait
from ..bus import Overflow
from ..engine.store import Store

log = logging.getLogger(__name__)
PRESENCE_CHANNEL = "presence"
HEARTBEAT = 2.0  # seconds between two announcements of the same connections
TTL = 3 * HEARTBEAT  # a process not heard of for this long is gone (three missed heartbeats)

Key = tuple[str, str]  # (name, role)
Counts = dict[Key, int]  # connections per (name, role)


class SharedPresence:
    """Connections per world: this process's own, and, when `shared`, the other processes' too."""

    def __init__(self, store: Store, instance: str, *, shared: bool, heartbeat: float = HEARTBEAT,
                 ttl: float = TTL) -> None:
        self.store = store
        self.instance = instance
        self.shared = shared
        self.heartbeat, self.ttl = heartbeat, ttl
        self._local: dict[str, dict[str, Key]] = {}  # world -> connection id -> (name, role)
        self._remote: dict[str, dict[str, tuple[Counts, float]]] = {}  # world -> instance -> (counts, heard at)
        self._ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """Join the other processes (distributed mode); returns once their news can reach us."""
        if not self.shared:
            return
        listening = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._gossip(listening), name="presence")
        await listening

    async def stop(self) -> None:
        """Stop telling, and tell the others this process's connections are gone."""
        if self._task is None:
            return
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(Exception):  # the others forget us after `ttl` anyway
            await self._tell({"bye": True})

    # -- this process's connections ------------------------------------------------
    async def join(self, world: str, member: dict[str, Any]) -> str:
        """Record a connection of `member` ({"name", "role"}); returns its connection id."""
        connection_id = f"conn_{next(self._ids)}"
        before = self.members(world)
        self._local.setdefault(world, {})[connection_id] = (str(member["name"]), str(member["role"]))
        await self._changed(world, before, announce=True)
        return connection_id

    async def leave(self, world: str, connection_id: str) -> None:
        """Forget a connection (unknown ids are ignored, so a double leave is harmless)."""
        connections = self._local.get(world)
        if connections is None or connection_id not in connections:
            return
        before = self.members(world)
        del connections[connection_id]
        if not connections:
            del self._local[world]
        await self._changed(world, before, announce=True)

    # -- everyone's -------------------------------------------------------------------
    def members(self, world: str) -> list[dict[str, Any]]:
        """[{"name", "role", "connections"}], one entry per (name, role) over every live process, by name."""
        total: Counts = dict(self._local_counts(world))
        for counts, _ in self._remote.get(world, {}).values():
            for key, n in counts.items():
                total[key] = total.get(key, 0) + n
        return [{"name": name, "role": role, "connections": n} for (name, role), n in sorted(total.items())]

    def _local_counts(self, world: str) -> Counts:
        counts: Counts = {}
        for key in self._local.get(world, {}).values():
            counts[key] = counts.get(key, 0) + 1
        return counts

    def _leads(self, world: str) -> bool:
        """Whether this process publishes `world`'s presence frames (see the module's docstring)."""
        holders = [i for i, (counts, _) in self._remote.get(world, {}).items() if counts]
        if self._local.get(world):
            holders.append(self.instance)
        return not holders or min(holders) == self.instance

    async def _changed(self, world: str, before: list[dict[str, Any]], *, announce: bool = False) -> None:
        if announce and self.shared:
            await self._announce(world)
        members = self.members(world)
        if members != before and self._leads(world):
            await self.store.publish(world, {"type": "presence", "members": members})

    # -- talking to the other processes ---------------------------------------------------
    async def _tell(self, message: dict[str, Any]) -> None:
        await self.store.bus.publish(PRESENCE_CHANNEL, orjson.dumps({"from": self.instance, **message}).decode())

    async def _announce(self, world: str) -> None:
        counts = self._local_counts(world)
        await self._tell({"world": world, "members": [[name, role, n] for (name, role), n in counts.items()]})

    async def _gossip(self, listening: asyncio.Future[None]) -> None:
        """Listen to the others, say hello, and keep announcing; start over if the bus cut us off."""
        while True:
            try:
                async with self.store.bus.subscribe(PRESENCE_CHANNEL, maxsize=10_000) as sub:
                    if not listening.done():
                        listening.set_result(None)
                    await self._tell({"hello": True})
                    next_beat = time.monotonic()
                    while True:
                        try:
                            async with asyncio.timeout(max(0.0, next_beat - time.monotonic())):
                                await self._heard(await sub.get())
                        except TimeoutError:
                            next_beat = time.monotonic() + self.heartbeat
                            for world in list(self._local):
                                await self._announce(world)
                            await self._forget_silent()
            except asyncio.CancelledError:
                raise
            except Overflow:
                log.warning("presence fell behind the bus; listening again")
            except Exception as exc:  # e.g. Redis is down: the bus reconnects, and so do we
                log.warning("presence gossip failed (%s); retrying in %.0fs", exc, self.heartbeat)
                if not listening.done():
                    listening.set_result(None)
                await asyncio.sleep(self.heartbeat)

    async def _heard(self, text: str) -> None:
        try:
            message = orjson.loads(text)
            sender = message["from"]
            if not isinstance(sender, str):
                raise TypeError("from")
            if sender == self.instance:
                return
            if message.get("hello"):
                for world in list(self._local):
                    await self._announce(world)
            elif message.get("bye"):
                for world in [w for w, heard in self._remote.items() if sender in heard]:
                    before = self.members(world)
                    self._remote[world].pop(sender)
                    await self._changed(world, before)
            else:
                world = message["world"]
                counts = {(str(name), str(role)): int(n) for name, role, n in message["members"]}
                if not isinstance(world, str):
                    raise TypeError("world")
                before = self.members(world)
                self._remote.setdefault(world, {})[sender] = (counts, time.monotonic())
                await self._changed(world, before)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignored a malformed presence message (%s): %.200s", exc, text)

    async def _forget_silent(self) -> None:
        """Drop what processes not heard of for `ttl` said: they were killed or cut off."""
        deadline = time.monotonic() - self.ttl
        for world, heard in list(self._remote.items()):
            gone = [instance for instance, (_, at) in heard.items() if at < deadline]
            if gone:
                before = self.members(world)
                for instance in gone:
                    del heard[instance]
                await self._changed(world, before)
        for world in [w for w, heard in self._remote.items() if not heard]:
            del self._remote[world]
