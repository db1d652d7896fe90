"""Who is connected to a world right now, across every process, published as `presence` frames (docs/protocol.md §6).

Each process knows its own connections. In the distributed mode it also tells the others about
them on the bus (`PRESENCE_CHANNEL`): at every change, every `heartbeat` seconds, and when a new
process says hello. What another process said is kept until it says goodbye or goes quiet for
`ttl` seconds (a killed process says nothing), so a member list is the sum over live processes.
Silence counts only while a process hears its own beats come back: through a broken bus
everyone seems quiet, and once it works again everyone gets a fresh `ttl` to speak.

Presence is live state, not history: it is never written to the event log.

Each change of a world's member list is published, as a `presence` frame, by its *leader*: the
live process with the smallest instance id among those that held connections to that world just
before or just after the change (a process that left is not counted). Every process sees the same
announcements, so they agree on the leader of each change.

Changes are coalesced per world (`COALESCE`): a process sends the first change at once (a lone join
shows at once), then at most one frame and one announcement per `COALESCE` seconds, each with the
latest member list or counts, until a window passes without a change. A process that led any change
of a window publishes the list as it is at the window's end. A process publishes the frame of its
own change before announcing it, so the leader's frame for the same change (if it is another
process) comes after.
Presence is best effort: a failed publish is logged and the next heartbeat repairs it.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

import orjson

from ...aio import cancel_and_wait
from ...bus import Overflow
from ...engine.store import Store

logger = logging.getLogger(__name__)
PRESENCE_CHANNEL = "presence"
HEARTBEAT = 2.0  # seconds between two announcements of the same connections
TTL = 3 * HEARTBEAT  # a process not heard of for this long is gone (three missed heartbeats)
# A crowd joining at once (2,000 sockets in a second or two) would otherwise get one frame per join on
# every socket: N² frames, which overflowed the sockets' queues. A quarter second is a delay no one
# notices in a member list, and it keeps a burst to four frames a second per world.
COALESCE = 0.25

Key = tuple[str, str]  # (name, role)
Counts = dict[Key, int]  # connections per (name, role)


class Pending:
    """What a world owes since its last send: a frame (this process led a change), an announcement."""
    __slots__ = ("announce", "frame", "task")

    def __init__(self) -> None:
        self.frame = self.announce = False
        self.task: asyncio.Task[None] | None = None


class SharedPresence:
    """Connections per world: this process's own, and, when `shared`, the other processes' too."""

    def __init__(self, store: Store, instance: str, *, shared: bool, heartbeat: float = HEARTBEAT,
                 ttl: float = TTL, coalesce: float = COALESCE) -> None:
        self.store = store
        self.instance = instance
        self.shared = shared
        self.heartbeat, self.ttl, self.coalesce = heartbeat, ttl, coalesce
        self._local: dict[str, dict[str, Key]] = {}  # world -> connection id -> (name, role)
        self._local_counts: dict[str, Counts] = {}  # world -> the same, counted (kept as they change: a
        # crowd's every join and snapshot would otherwise count all the world's connections again)
        self._remote: dict[str, dict[str, tuple[Counts, float]]] = {}  # world -> instance -> (counts, heard at)
        self._ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._echoed = time.monotonic()  # when our own last message came back to us
        self._pending: dict[str, Pending] = {}  # world -> its open coalescing window
        self._stopped = False

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
        self._stopped = True  # what is still pending is dropped: the goodbye below replaces it
        for pending in list(self._pending.values()):
            await cancel_and_wait(pending.task)
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
        before = self._holders(world)
        key = (str(member["name"]), str(member["role"]))
        self._local.setdefault(world, {})[connection_id] = key
        counts = self._local_counts.setdefault(world, {})
        counts[key] = counts.get(key, 0) + 1
        self._changed(world, before, announce=True)
        return connection_id

    async def leave(self, world: str, connection_id: str) -> None:
        """Forget a connection (unknown ids are ignored, so a double leave is harmless)."""
        if connection_id not in self._local.get(world, {}):
            return
        before = self._holders(world)
        self._drop(world, connection_id)
        self._changed(world, before, announce=True)

    def _drop(self, world: str, connection_id: str) -> None:
        connections = self._local.get(world, {})
        key = connections.pop(connection_id, None)
        if key is not None:
            counts = self._local_counts[world]
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
        if not connections:
            self._local.pop(world, None)
            self._local_counts.pop(world, None)

    # -- everyone's -------------------------------------------------------------------
    def members(self, world: str) -> list[dict[str, Any]]:
        """[{"name", "role", "connections"}], one entry per (name, role) over every live process, by name."""
        total: Counts = dict(self._local_counts.get(world, {}))
        for counts, _ in self._remote.get(world, {}).values():
            for key, n in counts.items():
                total[key] = total.get(key, 0) + n
        return [{"name": name, "role": role, "connections": n} for (name, role), n in sorted(total.items())]

    def _holders(self, world: str) -> frozenset[str]:
        """The processes holding connections to the world."""
        holders = {i for i, (counts, _) in self._remote.get(world, {}).items() if counts}
        if self._local.get(world):
            holders.add(self.instance)
        return frozenset(holders)

    def _changed(self, world: str, before: frozenset[str], *, changed: bool = True, announce: bool = False,
                 gone: str | None = None) -> None:
        """Note a change of the world's member list (`before`: the holders just before it): its frame if
        this process leads it, and, for a change of this process's own connections, an announcement.
        `gone`: a process that left. The first is sent at once, later ones at the window's end."""
        candidates = (before | self._holders(world)) - {gone}
        lead = changed and bool(candidates) and min(candidates) == self.instance
        announce = announce and self.shared
        if not (lead or announce) or self._stopped:
            return
        pending = self._pending.get(world)
        if pending is None:
            pending = self._pending[world] = Pending()
            pending.task = asyncio.create_task(self._send_coalesced(world, pending), name=f"presence {world}")
        pending.frame |= lead
        pending.announce |= announce

    async def _send_coalesced(self, world: str, pending: Pending) -> None:
        """Send what the world owes now, then once per window while changes keep coming."""
        try:
            while pending.frame or pending.announce:
                frame, announce = pending.frame, pending.announce
                pending.frame = pending.announce = False
                await self._send(world, frame=frame, announce=announce)
                await asyncio.sleep(self.coalesce)
        finally:
            if self._pending.get(world) is pending:
                del self._pending[world]

    async def _send(self, world: str, *, frame: bool, announce: bool) -> None:
        try:
            if frame:
                await self.store.publish(world, {"type": "presence", "members": self.members(world)})
            if announce:
                await self._announce(world)
        except Exception as exc:  # e.g. Redis is down: the next heartbeat tells the others again
            logger.warning("could not publish the presence of %s (%s)", world, exc)

    # -- talking to the other processes ---------------------------------------------------
    async def _tell(self, message: dict[str, Any]) -> None:
        await self.store.bus.publish(PRESENCE_CHANNEL, orjson.dumps({"from": self.instance, **message}).decode())

    async def _announce(self, world: str) -> None:
        counts = self._local_counts.get(world, {})
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
                logger.warning("presence fell behind the bus; listening again")
            except Exception as exc:  # e.g. Redis is down: the bus reconnects, and so do we
                logger.warning("presence gossip failed (%s); retrying in %.0fs", exc, self.heartbeat)
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
                    self._forget(world, sender)
            else:
                world, counts = message["world"], _counts(message["members"])
                if not isinstance(world, str):
                    raise TypeError("world")
                before = self._holders(world)
                heard = self._remote.setdefault(world, {})
                said = heard[sender][0] if sender in heard else {}
                heard[sender] = (counts, time.monotonic())
                self._changed(world, before, changed=counts != said)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignored a malformed presence message (%s): %.200s", exc, text)

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
                self._forget(world, instance)
        for world in [w for w, heard in self._remote.items() if not heard]:
            del self._remote[world]

    def _forget(self, world: str, instance: str) -> None:
        """Drop what `instance` said about `world`: it left, or went silent."""
        before = self._holders(world)
        counts, _ = self._remote[world].pop(instance, ({}, 0.0))
        self._changed(world, before, changed=bool(counts), gone=instance)


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
