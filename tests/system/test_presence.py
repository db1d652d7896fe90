"""Presence across processes: each process tells the others about its connections on the Redis bus.

Every "process" here is a Store on a bus connection of its own to one real Redis, as separate
`agent-world serve` processes would be (tests/system/test_distributed_servers.py runs real ones).
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from server.api.live.presence import COALESCE, PRESENCE_CHANNEL, SharedPresence
from server.bus import Bus
from server.bus.memory import MemoryBackend
from server.bus.redis import RedisBackend
from server.engine.store import Store, channel
from server.log.sqlite import SqliteLog
from tests.fixtures.eventually import eventually_async
from tests.fixtures.storage import unique_name

WORLD = "w_presence"
HEARTBEAT, TTL = 0.1, 1.0


class Processes:
    """Opens presences that share one Redis namespace, each on its own bus connection."""

    def __init__(self, url: str, log: SqliteLog) -> None:
        self.url, self.log = url, log
        self.prefix = unique_name()
        self.buses: list[Bus] = []
        self.presences: list[SharedPresence] = []

    async def bus(self) -> Bus:
        bus = Bus(RedisBackend(self.url, prefix=self.prefix, client_name=unique_name("awtest-presence")))
        await bus.connect()
        self.buses.append(bus)
        return bus

    async def start(self, instance: str, ttl: float = TTL, heartbeat: float = HEARTBEAT,
                    coalesce: float = COALESCE) -> SharedPresence:
        presence = SharedPresence(Store(self.log, await self.bus()), instance, shared=True,
                                  heartbeat=heartbeat, ttl=ttl, coalesce=coalesce)
        await presence.start()
        self.presences.append(presence)
        return presence

    async def close(self) -> None:
        for presence in self.presences:
            await presence.stop()
        for bus in self.buses:
            await bus.disconnect()


@pytest.fixture
async def processes(redis_url: str, tmp_path: Path) -> AsyncIterator[Processes]:
    log = await SqliteLog.open(tmp_path / "unused.sqlite3")  # presence never touches the log
    made = Processes(redis_url, log)
    try:
        yield made
    finally:
        await made.close()
        await log.close()


def names(presence: SharedPresence) -> dict[str, int]:
    return {m["name"]: m["connections"] for m in presence.members(WORLD)}


async def test_a_member_connected_through_another_process_is_listed_everywhere(processes: Processes) -> None:
    a, b = await processes.start("proc_a"), await processes.start("proc_b")
    await a.join(WORLD, {"name": "ann", "role": "member"})
    await b.join(WORLD, {"name": "bob", "role": "spectator"})
    await b.join(WORLD, {"name": "bob", "role": "spectator"})
    await eventually_async(lambda: names(a) == names(b) == {"ann": 1, "bob": 2})
    assert a.members(WORLD) == [{"name": "ann", "role": "member", "connections": 1},
                                {"name": "bob", "role": "spectator", "connections": 2}]


async def test_a_process_started_later_learns_at_once_who_is_connected(processes: Processes) -> None:
    quiet = SharedPresence(Store(processes.log, await processes.bus()), "proc_a", shared=True,
                           heartbeat=60, ttl=180)  # no heartbeat of its own will tell the newcomer
    await quiet.start()
    processes.presences.append(quiet)
    await quiet.join(WORLD, {"name": "ann", "role": "member"})
    newcomer = await processes.start("proc_b")
    await eventually_async(lambda: names(newcomer) == {"ann": 1}, timeout=1.0)  # its hello was answered


async def test_each_change_is_published_once_whichever_process_sees_it(
        processes: Processes, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="server.api.live.presence")
    a, b = await processes.start("proc_a"), await processes.start("proc_b")
    frames: list[dict[str, Any]] = []
    async with (await processes.bus()).subscribe(channel(WORLD)) as sub:
        async def collect() -> None:
            async for text in sub:
                frames.append(json.loads(text))
        collector = asyncio.create_task(collect())
        joined = await b.join(WORLD, {"name": "bob", "role": "member"})
        await eventually_async(lambda: len(frames) == 1)
        ann = await a.join(WORLD, {"name": "ann", "role": "member"})
        await eventually_async(lambda: len(frames) == 2)
        await b.leave(WORLD, joined)
        await eventually_async(lambda: len(frames) == 3)
        await a.leave(WORLD, ann)  # the world is empty now: that too is told once
        await eventually_async(lambda: len(frames) == 4)
        await asyncio.sleep(5 * HEARTBEAT)  # heartbeats change nothing: no more frames
        collector.cancel()
    assert [[m["name"] for m in f["members"]] for f in frames] == [["bob"], ["ann", "bob"], ["ann"], []]
    assert all(f["type"] == "presence" for f in frames)
    assert not [r for r in caplog.records if "malformed" in r.getMessage()], "another process's heartbeat was refused"


async def test_a_stopped_process_is_forgotten_at_once(processes: Processes) -> None:
    a = await processes.start("proc_a", ttl=600)  # only b's goodbye can make it forget b in time
    b = await processes.start("proc_b")
    await b.join(WORLD, {"name": "bob", "role": "member"})
    await eventually_async(lambda: names(a) == {"bob": 1})
    await b.stop()
    await eventually_async(lambda: names(a) == {})


async def test_a_process_cut_off_without_a_word_is_forgotten_after_the_ttl(processes: Processes) -> None:
    a, b = await processes.start("proc_a"), await processes.start("proc_b")
    await b.join(WORLD, {"name": "bob", "role": "member"})
    await eventually_async(lambda: names(a) == {"bob": 1})
    await processes.buses[1].disconnect()  # b can no longer say anything, not even goodbye
    await asyncio.sleep(TTL / 4)
    assert names(a) == {"bob": 1}, "forgotten before the TTL"
    await eventually_async(lambda: names(a) == {}, timeout=2 * TTL + 2 * HEARTBEAT)


async def test_malformed_presence_messages_are_ignored(processes: Processes) -> None:
    a, b = await processes.start("proc_a"), await processes.start("proc_b")
    bus = await processes.bus()
    for junk in ("not json", "[]", '{"from": 7}', '{"from": "x", "world": "w", "members": [["a"]]}',
                 '{"from": "x", "world": 5, "members": []}', '{"from": "x"}',
                 '{"from": "x", "world": "w", "members": [["a", "member", 0]]}',
                 '{"from": "x", "world": "w", "members": [["a", "member", -2]]}',
                 '{"from": "x", "world": "w", "members": [["a", 1, 1]]}',
                 '{"from": "x", "world": "w", "members": {"a": 1}}'):
        await bus.publish(PRESENCE_CHANNEL, junk)
    await b.join(WORLD, {"name": "bob", "role": "member"})
    await eventually_async(lambda: names(a) == {"bob": 1})
    assert [m for m in a.members("w") if m["name"] == "a"] == []


class FlakyBackend(MemoryBackend):
    """One process's bus whose publishes fail while `down` (as Redis being unreachable would)."""

    down = False

    async def publish(self, channel: str, message: str) -> None:
        if self.down:
            raise ConnectionError("the bus is down")
        await super().publish(channel, message)


async def test_after_an_outage_longer_than_the_ttl_nobody_is_forgotten_before_they_can_speak(
        tmp_path: Path) -> None:
    log = await SqliteLog.open(tmp_path / "unused.sqlite3")
    backend = FlakyBackend()
    bus = Bus(backend)  # both presences share it, as two processes share one Redis
    await bus.connect()
    a = SharedPresence(Store(log, bus), "proc_a", shared=True, heartbeat=HEARTBEAT, ttl=TTL)
    b = SharedPresence(Store(log, bus), "proc_b", shared=True, heartbeat=HEARTBEAT, ttl=TTL)
    try:
        await a.start()
        await b.start()
        await b.join(WORLD, {"name": "bob", "role": "member"})
        await eventually_async(lambda: names(a) == {"bob": 1})
        backend.down = True
        await asyncio.sleep(2 * TTL)
        backend.down = False
        seen = []
        for _ in range(int(3 * TTL / 0.01)):  # through the recovery and past one more TTL
            seen.append(names(a))
            await asyncio.sleep(0.01)
        assert all(view == {"bob": 1} for view in seen), [view for view in seen if view != {"bob": 1}][:3]
    finally:
        await a.stop()
        await b.stop()
        await bus.disconnect()
        await log.close()


def connections(frame: dict[str, Any]) -> int:
    return sum(m["connections"] for m in frame["members"])


async def test_the_embedded_mode_counts_its_own_connections_only(tmp_path: Path) -> None:
    log = await SqliteLog.open(tmp_path / "log.sqlite3")
    bus = Bus(MemoryBackend())
    await bus.connect()
    presence = SharedPresence(Store(log, bus), "proc_a", shared=False)
    await presence.start()
    try:
        async with bus.subscribe(channel(WORLD)) as sub:
            first = await presence.join(WORLD, {"name": "ann", "role": "owner"})
            assert json.loads(await sub.get())["members"] == [{"name": "ann", "role": "owner", "connections": 1}]
            await presence.join(WORLD, {"name": "ann", "role": "owner"})
            await presence.leave(WORLD, first)
            await presence.leave(WORLD, first)  # a second leave is harmless and says nothing
            seen = [connections(json.loads(await sub.get()))]
            while seen[-1] != 1:  # the burst's last frame has the final count (2, then 1, if it was slow)
                seen.append(connections(json.loads(await sub.get())))
            await presence.join(WORLD, {"name": "ann", "role": "owner"})
            assert connections(json.loads(await sub.get())) == 2, "a frame came in between"
        assert seen in ([1], [2, 1]), seen
        assert bus.subscriber_count(PRESENCE_CHANNEL) == 0, "no gossip in the embedded mode"
    finally:
        await presence.stop()
        await bus.disconnect()
        await log.close()


async def test_a_lone_join_is_published_at_once(processes: Processes) -> None:
    a = await processes.start("proc_a", coalesce=600)  # a frame held for the window would time the test out
    b = await processes.start("proc_b", coalesce=600)
    async with (await processes.bus()).subscribe(channel(WORLD)) as sub:
        await b.join(WORLD, {"name": "bob", "role": "member"})
        async with asyncio.timeout(30):
            assert json.loads(await sub.get())["members"] == [{"name": "bob", "role": "member", "connections": 1}]
            await eventually_async(lambda: names(a) == {"bob": 1})  # b's announcement was not held either


async def test_a_burst_of_joins_is_published_as_a_few_frames_with_the_final_members(processes: Processes) -> None:
    # Heartbeats every minute: every announcement seen here is one of a change.
    a = await processes.start("proc_a", heartbeat=60, ttl=180)
    b = await processes.start("proc_b", heartbeat=60, ttl=180)
    bus = await processes.bus()
    frames: list[dict[str, Any]] = []
    announcements: list[dict[str, Any]] = []
    async with bus.subscribe(channel(WORLD)) as sub, bus.subscribe(PRESENCE_CHANNEL) as gossip:
        async def collect() -> None:
            async for text in sub:
                frames.append(json.loads(text))

        async def listen() -> None:
            async for text in gossip:
                if "world" in (message := json.loads(text)):
                    announcements.append(message)
        collectors = [asyncio.create_task(collect()), asyncio.create_task(listen())]
        try:
            ids = []
            for n in range(200):  # a crowd arriving over both processes, as fast as it can
                ids.append(await (a if n % 2 else b).join(WORLD, {"name": f"user{n % 7}", "role": "spectator"}))
                await asyncio.sleep(0)
            await eventually_async(lambda: frames and connections(frames[-1]) == 200, timeout=10)
            burst, said = len(frames), len(announcements)
            await a.leave(WORLD, ids[1])  # a later change, so that a late frame of the burst would show
            await eventually_async(lambda: frames and connections(frames[-1]) == 199, timeout=10)
        finally:
            for task in collectors:
                task.cancel()
            await asyncio.gather(*collectors, return_exceptions=True)
    assert connections(frames[burst - 1]) == 200 and len(frames) == burst + 1, [connections(f) for f in frames]
    assert burst <= 10, f"{burst} frames for 200 joins"
    assert said <= 20, f"{said} announcements for 200 joins"
    assert {m["name"]: m["connections"] for m in frames[burst - 1]["members"]} == {
        f"user{i}": len(range(i, 200, 7)) for i in range(7)}
