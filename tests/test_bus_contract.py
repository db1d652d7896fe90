"""The bus contract, through `Bus`, over every backend (in-process memory and Redis pub/sub)."""
from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio as aioredis

from server.bus.base import Bus, Overflow, Subscription
from server.bus.redis import RedisBackend
from tests.fixtures.storage import BusImpl, unique_name

WAIT = 5.0  # seconds: generous for a loaded CI machine, never reached when things work


async def take(sub: Subscription, n: int) -> list[str]:
    async with asyncio.timeout(WAIT):
        return [await sub.get() for _ in range(n)]


async def nothing_more(sub: Subscription) -> bool:
    await asyncio.sleep(0.05)
    return sub.get_nowait() is None


async def test_messages_arrive_in_publish_order(bus_impl: BusImpl) -> None:
    bus, ch = await bus_impl.open(), bus_impl.channel()
    async with bus.subscribe(ch) as sub:
        for i in range(100):
            await bus.publish(ch, f"m{i}")
        await asyncio.gather(*(bus.publish(ch, f"c{i}") for i in range(300)))  # concurrent
        got = await take(sub, 400)
    assert got == [f"m{i}" for i in range(100)] + [f"c{i}" for i in range(300)]


async def test_every_subscriber_gets_every_message(bus_impl: BusImpl) -> None:
    bus, ch = await bus_impl.open(), bus_impl.channel()
    async with bus.subscribe(ch) as one, bus.subscribe(ch) as two:
        assert bus.subscriber_count(ch) == 2
        for i in range(20):
            await bus.publish(ch, str(i))
        expected = [str(i) for i in range(20)]
        assert await take(one, 20) == expected
        assert await take(two, 20) == expected


async def test_a_subscriber_gets_only_its_channel(bus_impl: BusImpl) -> None:
    bus, mine, other = await bus_impl.open(), bus_impl.channel("mine"), bus_impl.channel("other")
    async with bus.subscribe(mine) as sub, bus.subscribe(other) as beside:
        await bus.publish(other, "not for you")
        await bus.publish(bus_impl.channel("nobody"), "for nobody")
        await bus.publish(mine, "for you")
        assert await take(sub, 1) == ["for you"]
        assert await take(beside, 1) == ["not for you"]
        assert await nothing_more(sub)


async def test_unsubscribing_stops_delivery(bus_impl: BusImpl) -> None:
    bus, ch, probe_ch = await bus_impl.open(), bus_impl.channel(), bus_impl.channel("probe")
    async with bus.subscribe(probe_ch) as probe:
        async with bus.subscribe(ch) as gone:
            await bus.publish(ch, "before")
            assert await take(gone, 1) == ["before"]
        assert bus.subscriber_count(ch) == 0
        await bus.publish(ch, "after")
        await bus.publish(probe_ch, "marker")  # same publisher, so it arrives after "after" would
        assert await take(probe, 1) == ["marker"]
        assert await nothing_more(gone)
        async with bus.subscribe(ch) as again:  # subscribing anew works
            await bus.publish(ch, "again")
            assert await take(again, 1) == ["again"]
        assert gone.get_nowait() is None


async def test_a_slow_subscriber_overflows_without_slowing_others(bus_impl: BusImpl) -> None:
    bus, ch = await bus_impl.open(), bus_impl.channel()
    async with bus.subscribe(ch, maxsize=5) as slow, bus.subscribe(ch, maxsize=1000) as fast:
        for i in range(50):
            await bus.publish(ch, str(i))
        assert await take(fast, 50) == [str(i) for i in range(50)]
        assert [slow.get_nowait() for _ in range(5)] == ["0", "1", "2", "3", "4"]
        assert slow.overflowed
        with pytest.raises(Overflow):
            await asyncio.wait_for(slow.get(), WAIT)
        await bus.publish(ch, "later")
        assert await take(fast, 1) == ["later"]


# -- Redis only: several processes, and a dropped connection --------------------------------------
def redis_bus(url: str, name: str | None = None) -> Bus:
    return Bus(RedisBackend(url, client_name=name or unique_name("awtest-bus")))


async def test_two_processes_see_each_others_publishes(redis_url: str) -> None:
    first, second = redis_bus(redis_url), redis_bus(redis_url)
    await first.connect()
    await second.connect()
    ch = unique_name("awtest-ch")
    try:
        async with first.subscribe(ch) as a, second.subscribe(ch) as b:
            await first.publish(ch, "from first")
            await second.publish(ch, "from second")
            assert await take(a, 2) == ["from first", "from second"]
            assert await take(b, 2) == ["from first", "from second"]
    finally:
        await first.disconnect()
        await second.disconnect()


async def test_redis_bus_reconnects_and_resubscribes(redis_url: str) -> None:
    name = unique_name("awtest-bus")
    bus, publisher = redis_bus(redis_url, name), redis_bus(redis_url)
    await bus.connect()
    await publisher.connect()
    admin = aioredis.Redis.from_url(redis_url, decode_responses=True)
    ch = unique_name("awtest-ch")
    try:
        async with bus.subscribe(ch) as sub:
            await publisher.publish(ch, "before")
            assert await take(sub, 1) == ["before"]
            # Drop this bus's subscriber connection (and only it), as a Redis restart would.
            clients = await admin.client_list(_type="pubsub")
            ids = [c["id"] for c in clients if c.get("name") == name]
            assert len(ids) == 1
            await admin.execute_command("CLIENT", "KILL", "ID", ids[0])
            # Messages sent while it is down are lost (pub/sub is at-most-once): keep publishing
            # until one gets through the new connection.
            async with asyncio.timeout(WAIT):
                for i in range(10_000):
                    await publisher.publish(ch, f"after {i}")
                    with contextlib.suppress(TimeoutError):
                        got = await asyncio.wait_for(sub.get(), 0.05)
                        assert got.startswith("after ")
                        break
            await publisher.publish(ch, "steady")
            rest = await take(sub, 1)
            while rest[-1] != "steady":
                rest += await take(sub, 1)
    finally:
        await admin.aclose()
        await bus.disconnect()
        await publisher.disconnect()


async def test_redis_bus_unreachable_names_the_url() -> None:
    backend = RedisBackend("redis://127.0.0.1:1/0")
    with pytest.raises(ConnectionError, match="127.0.0.1:1"):
        await backend.connect()
    with pytest.raises(RuntimeError, match="not connected"):
        await backend.publish("ch", "x")
