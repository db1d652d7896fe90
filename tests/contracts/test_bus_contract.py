"""The bus contract, through `Bus`, over every backend (in-process memory and Redis pub/sub)."""
from __future__ import annotations

import asyncio
import re

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from server.bus.base import Bus, Gap, Overflow, Subscription
from server.bus.memory import MemoryBackend
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


async def kill_subscriber_connections(url: str, name: str) -> None:
    """Drop the subscriber connections of the bus named `name` (and only them), as a Redis restart would:
    its one connection, or on a cluster its connection to each master."""
    if "+cluster://" in url:
        cluster = RedisCluster.from_url(url.replace("+cluster", ""))
        await cluster.initialize()
        nodes = [f"redis://{node.host}:{node.port}/0" for node in cluster.get_primaries()]
        await cluster.aclose()
    else:
        nodes = [url]
    for node in nodes:
        admin = aioredis.Redis.from_url(node, decode_responses=True)
        try:
            ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
            assert ids, f"no subscriber connection named {name} on {node}"
            for client_id in ids:
                # redis-py leaves execute_command untyped
                await admin.execute_command("CLIENT", "KILL", "ID", client_id)  # type: ignore[no-untyped-call]
        finally:
            await admin.aclose()


async def gap(sub: Subscription) -> Gap:
    with pytest.raises(Gap) as caught:
        async with asyncio.timeout(WAIT):
            await sub.get()
    return caught.value


@pytest.mark.parametrize("server", ["redis", "cluster"])
async def test_redis_bus_tells_every_subscriber_of_a_gap_and_resubscribes(
        server: str, request: pytest.FixtureRequest) -> None:
    redis_url: str = request.getfixturevalue("redis_cluster" if server == "cluster" else "redis_url")
    name = unique_name("awtest-bus")
    bus, publisher = redis_bus(redis_url, name), redis_bus(redis_url)
    await bus.connect()
    await publisher.connect()
    ch, other = unique_name("awtest-ch"), unique_name("awtest-ch")
    try:
        async with bus.subscribe(ch) as sub, bus.subscribe(ch) as twin, bus.subscribe(other) as beside:
            await publisher.publish(ch, "before")
            assert await take(sub, 1) == ["before"] and await take(twin, 1) == ["before"]
            await kill_subscriber_connections(redis_url, name)
            for each in (sub, twin, beside):
                lost = await gap(each)
                assert lost.down and lost.channel == each.channel
                back = await gap(each)
                assert not back.down
            # Told "back" only once subscribed again: the very next publish arrives, on every channel.
            await publisher.publish(ch, "after")
            await publisher.publish(other, "beside")
            assert await take(sub, 1) == ["after"] and await take(twin, 1) == ["after"]
            assert await take(beside, 1) == ["beside"]
            assert await nothing_more(sub)
    finally:
        await bus.disconnect()
        await publisher.disconnect()


async def test_redis_bus_unreachable_names_the_url() -> None:
    backend = RedisBackend("redis://127.0.0.1:1/0")
    with pytest.raises(ConnectionError, match=re.escape("127.0.0.1:1")):
        await backend.connect()
    with pytest.raises(RuntimeError, match="not connected"):
        await backend.publish("ch", "x")


async def test_a_missed_message_is_a_gap_to_every_subscriber_of_its_channel_in_every_process(
        bus_impl: BusImpl) -> None:
    """A publisher whose message the backend refused says so (`missed`): every subscriber of that channel,
    here and in other processes, gets a Gap after what came before, and goes on getting messages."""
    here = await bus_impl.open()
    there = here if bus_impl.name == "memory" else await bus_impl.open()  # memory: one process
    ch, other = bus_impl.channel(), bus_impl.channel("other")
    async with here.subscribe(ch) as mine, there.subscribe(ch) as theirs, there.subscribe(other) as beside:
        await here.publish(ch, "before")
        here.missed(ch)
        for sub in (mine, theirs):
            assert await take(sub, 1) == ["before"]
            told = await gap(sub)
            assert not told.down and told.channel == ch
        await here.publish(ch, "after")
        assert await take(theirs, 1) == ["after"]
        assert await nothing_more(beside)


async def test_a_missed_notice_the_backend_refused_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("server.bus.base.RETRY_FIRST", 0.01)
    bus = Bus(MemoryBackend())
    await bus.connect()
    publish = bus.backend.publish
    refused: list[str] = []

    async def refusing_twice(channel: str, message: str) -> None:
        if len(refused) < 2:
            refused.append(message)
            raise ConnectionError("Redis is restarting")
        await publish(channel, message)
    monkeypatch.setattr(bus.backend, "publish", refusing_twice)
    try:
        async with bus.subscribe("ch") as sub:
            bus.missed("ch")
            bus.missed("ch")  # one notice at a time per channel
            assert not (await gap(sub)).down
            assert len(refused) == 2 and await nothing_more(sub)
    finally:
        await bus.disconnect()


async def test_a_message_missed_while_the_notice_is_on_its_way_gets_a_notice_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend has taken the notice (Redis hands it to the other processes, which read the log at
    once) but its answer is late; meanwhile another event is stored and its publish fails. The notice on
    its way may have been read before that event was stored: it does not cover it, another one must go."""
    bus = Bus(MemoryBackend())
    await bus.connect()
    sent, answer = [], asyncio.Event()

    async def slow_answer(channel: str, message: str) -> None:
        sent.append(message)  # taken by the backend: its subscribers may act on it from now on
        if len(sent) == 1:
            await answer.wait()
    monkeypatch.setattr(bus.backend, "publish", slow_answer)
    try:
        async with bus.subscribe("ch") as sub:
            bus.missed("ch")
            async with asyncio.timeout(WAIT):
                while not sent:
                    await asyncio.sleep(0.01)
            bus.missed("ch")  # an event stored after the first notice was out
            answer.set()
            assert not (await gap(sub)).down
            assert not (await gap(sub)).down
            assert len(sent) == 2
    finally:
        await bus.disconnect()


async def test_missed_notices_of_one_channel_go_at_most_one_every_half_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each notice makes every reader of the world catch up from the log: a run of timed-out writes, each
    told after the notice before it was taken, must not become a notice per write."""
    bus = Bus(MemoryBackend())
    await bus.connect()
    publish, sent = bus.backend.publish, []

    async def counting(channel: str, message: str) -> None:
        sent.append(asyncio.get_running_loop().time())
        await publish(channel, message)
    monkeypatch.setattr(bus.backend, "publish", counting)
    try:
        async with bus.subscribe("ch") as sub:
            for _ in range(5):  # each after the notice before it is out
                bus.missed("ch")
                await asyncio.sleep(0.05)
            assert len(sent) == 1, sent
            assert not (await gap(sub)).down
            assert not (await gap(sub)).down  # the ones missed since: one more notice, after the half second
            assert len(sent) == 2 and sent[1] - sent[0] >= 0.45, sent
            assert await nothing_more(sub)
    finally:
        await bus.disconnect()


class _SlowSubscribes(MemoryBackend):
    """Subscribes that wait (Redis slow to confirm); `subscribed` is what the backend is subscribed to."""

    def __init__(self) -> None:
        self.subscribed: set[str] = set()
        self.confirm = asyncio.Event()

    async def subscribe(self, channel: str) -> None:
        self.subscribed.add(channel)  # sent: the backend carries the channel from now on
        await self.confirm.wait()

    async def unsubscribe(self, channel: str) -> None:
        self.subscribed.discard(channel)


async def test_a_subscriber_cancelled_while_subscribing_leaves_no_subscription_behind() -> None:
    backend = _SlowSubscribes()
    bus = Bus(backend)
    await bus.connect()

    async def listen() -> None:
        async with bus.subscribe("ch"):
            await asyncio.Event().wait()
    try:
        task = asyncio.create_task(listen())
        async with asyncio.timeout(WAIT):
            while "ch" not in backend.subscribed:
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert backend.subscribed == set() and bus.subscriber_count("ch") == 0
    finally:
        await bus.disconnect()


async def test_a_subscriber_cancelled_while_another_subscribes_too_leaves_the_other_subscribed() -> None:
    backend = _SlowSubscribes()
    bus = Bus(backend)
    await bus.connect()
    entered = asyncio.Event()

    async def listen(tell: asyncio.Event | None = None) -> None:
        async with bus.subscribe("ch"):
            if tell is not None:
                tell.set()
            await asyncio.Event().wait()
    try:
        first, second = asyncio.create_task(listen()), asyncio.create_task(listen(entered))
        await asyncio.sleep(0.05)  # both wait on the backend's subscribe
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        backend.confirm.set()
        async with asyncio.timeout(WAIT):
            await entered.wait()
        assert backend.subscribed == {"ch"} and bus.subscriber_count("ch") == 1
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert backend.subscribed == set()
    finally:
        await bus.disconnect()
