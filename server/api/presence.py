"""Who is connected to a world right now, across every process, published as `presence` frames (docs/protocol.md §6).

Each process knows its own connections. In the distributed mode it also tells the others about
them on the bus (`PRESENCE_CHANNEL`): at every change, every `heartbeat` seconds, and when a new
process says hello. What another process said is kept until it says goodbye or goes quiet for
`ttl` seconds (a killed process says nothing), so a member list is the sum over live processes.
Silence counts only while a process hears its own beats come back: through a broken bus
everyone seems quiet, and once it works again everyone gets a fresh `ttl` to speak.

Presence is live state, not history: it is never written to the event log.

Each change of a world's member list is published once, as a `presence` frame, by its *leader*:
the live process with the smallest instance id among those that held connections to that world
just before or just after the change. Every process sees the same announcements, so they agree
on the leader. A process publishes the frame of its own change before announcing it, so the
leader's frame for the same change (if it is another process) always comes after.
Presence is best effort: a failed publish is logged and the next heartbeat repairs it.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any, NamedTuple

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


class View(NamedTuple):
    """A world's presence as this process sees it at one moment."""
    members: list[dict[str, Any]]
    holders: frozenset[str]  # the processes holding connections to the world


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
        self._echoed = time.monotonic()  # when our own last message came back to us

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
        before = self._view(world)
        self._local.setdefault(world, {})[connection_id] = (str(member["name"]), str(member["role"]))
        try:
            await self._changed(world, before, announce=True)
        except BaseException:  # cancelled: the caller never got the id, so it will never leave
            self._drop(world, connection_id)
            raise
        return connection_id

    async def leave(self, world: str, connection_id: str) -> None:
        """Forget a connection (unknown ids are ignored, so a double leave is harmless)."""
        if connection_id not in self._local.get(world, {}):
            return
        before = self._view(world)
        self._drop(world, connection_id)
        await self._changed(world, before, announce=True)

    def _drop(self, world: str, connection_id: str) -> None:
        connections = self._local.get(world, {})
        connections.pop(connection_id, None)
        if not connections:
            self._local.pop(world, None)

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

    def _view(self, world: str) -> View:
        holders = {i for i, (counts, _) in self._remote.get(world, {}).items() if counts}
        if self._local.get(world):
            holders.add(self.instance)
        return View(self.members(world), frozenset(holders))

    async def _changed(self, world: str, before: View, *, announce: bool = False, gone: str | None = None) -> None:
        """Publish the world's new member list if it changed and this process leads it; then, for a
        change of this process's own connections, tell the others. `gone`: a process that left."""
        after = self._view(world)
        candidates = (before.holders | after.holders) - {gone}
        try:
            if after.members != before.members and candidates and min(candidates) == self.instance:
                await self.store.publish(world, {"type": "presence", "members": after.members})
            if announce and self.shared:
                await self._announce(world)
        except Exception as exc:  # e.g. Redis is down: the next heartbeat tells the others again
            log.warning("could not publish the presence of %s (%s)", world, exc)

    # -- talking to the other processes ---------------------------------------------------
    async def _tell(self, message: dict[str, Any]) -> None:
        await self.store.bus.publish(PRESENCE_CHANNEL, orjson.dumps({"from": self.instance, **message}).decode())

    async def _announce(self, world: str) -> None:
        counts = self._local_counts(world)
        await self._tell({"world": world, "members": [[name, role, n] for (name, role), n in counts.items()]})

    async def _announce_all(self) -> None:
        for world in list(self._local):
            await self._announce(world)

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
                                text = await sub.get()
                        except TimeoutError:
                            next_beat = time.monotonic() + self.heartbeat
                            await self._beat()
                            continue
                        await self._heard(text)
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
                self._heard_myself()
                return
            if message.get("beat"):
                return  # another process's heartbeat: its announcements follow it
            if message.get("hello"):
                await self._announce_all()
            elif message.get("bye"):
                for world in [w for w, heard in self._remote.items() if sender in heard]:
                    await self._forget(world, sender)
            else:
                world, counts = message["world"], _counts(message["members"])
                if not isinstance(world, str):
                    raise TypeError("world")
                before = self._view(world)
                self._remote.setdefault(world, {})[sender] = (counts, time.monotonic())
                await self._changed(world, before)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignored a malformed presence message (%s): %.200s", exc, text)

    async def _beat(self) -> None:
        """Say we are here (to hear our own echo), repeat our connections, forget the silent."""
        await self._tell({"beat": True})
        await self._announce_all()
        await self._forget_silent()

    def _deaf(self, now: float) -> bool:
        """Whether our own messages have stopped coming back (then silence proves nothing)."""
        return now - self._echoed > 2 * self.heartbeat

    def _heard_myself(self) -> None:
        """Our own message came back: the bus carries messages both ways."""
        now = time.monotonic()
        if self._deaf(now):
            # We could not speak or hear for a while, so nobody could be heard: restart every clock.
            for heard in self._remote.values():
                for instance, (counts, _) in heard.items():
                    heard[instance] = (counts, now)
        self._echoed = now

    async def _forget_silent(self) -> None:
        """Drop what processes not heard of for `ttl` said: they were killed or cut off.

        Only while our own messages come back: silence heard through a broken bus proves nothing.
        """
        now = time.monotonic()
        if self._deaf(now):
            return
        for world, heard in list(self._remote.items()):
            for instance in [instance for instance, (_, at) in heard.items() if at < now - self.ttl]:
                await self._forget(world, instance)
        for world in [w for w, heard in self._remote.items() if not heard]:
            del self._remote[world]

    async def _forget(self, world: str, instance: str) -> None:
        """Drop what `instance` said about `world`: it left, or went silent."""
        before = self._view(world)
        self._remote[world].pop(instance, None)
        await self._changed(world, before, gone=instance)


def _counts(members: object) -> Counts:
    """An announcement's [[name, role, connections], ...], checked: names and roles are strings, counts positive."""
    if not isinstance(members, list):
        raise TypeError("members")
    counts: Counts = {}
    for name, role, n in members:
        if not (isinstance(name, str) and isinstance(role, str) and type(n) is int and n > 0):
            raise ValueError(f"bad member {[name, role, n]!r}")
        counts[(name, role)] = n
    return counts
