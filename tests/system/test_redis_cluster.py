"""Redis Cluster: a real three-master cluster (tests/fixtures/redis_servers.py).

The log and bus contract suites run on it as well (`log_impl`, `bus_impl`); here: each world's keys
on one slot, channels sharded over the masters, and two servers sharing worlds through it.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from server.bus import Bus
from server.bus.redis import RedisBackend
from server.log.base import Claim, Close, Fence, Open, Tag
from server.log.redis.log import RedisLog
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, client_for, make_world, wait_until
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.storage import unique_name
from tests.fixtures.ws import read_until, replay_and_snapshot, ws_connect

STARTUP = 60.0  # seconds a server may take to answer /healthz on a loaded machine


@pytest.fixture
def admin(redis_cluster: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster.replace("+cluster", ""), decode_responses=True)
    yield client
    client.close()


async def test_every_key_of_a_world_lives_on_one_slot(redis_cluster: str, admin: RedisCluster) -> None:
    prefix = unique_name()
    log = await RedisLog.open(redis_cluster, prefix)
    try:
        worlds = [f"w{i}" for i in range(12)]
        for world in worlds:
            token = await log.lease("agent:alice", "proc", ttl=5, world=world)
            await log.append(world, {"kind": "message"}, [Open("turn"), Claim("issued"), Tag("memory"),
                                                          Fence("agent:alice", token)])
            await log.append(world, {"kind": "message"}, [Close("turn"), Tag("audit")])
        await log.lease("proc:me", "proc", ttl=5)
    finally:
        await log.close()
    slots: dict[str, set[int]] = defaultdict(set)
    for key in admin.scan_iter(match=f"{{{prefix}*", count=1000, target_nodes=RedisCluster.ALL_NODES):
        slots[key[1:key.index("}")]].add(admin.keyslot(key))  # type: ignore[no-untyped-call]  # untyped in redis-py
    assert set(slots) == {f"{prefix}:{w}" for w in worlds} | {prefix}
    assert all(len(found) == 1 for found in slots.values()), slots
    world_slots = {slots[f"{prefix}:{w}"].pop() for w in worlds}
    owners = {admin.nodes_manager.get_node_from_slot(slot).name for slot in world_slots}
    assert len(owners) > 1, "worlds are spread over the masters"


async def test_world_channels_are_sharded_over_the_masters(redis_cluster: str, admin: RedisCluster) -> None:
    prefix = unique_name()
    bus = Bus(RedisBackend(redis_cluster, prefix=prefix))
    await bus.connect()
    channels = [f"world:w{i}" for i in range(12)]
    try:
        subs = [bus.subscribe(ch) for ch in channels]
        for sub in subs:
            await sub.__aenter__()
        # redis-py leaves execute_command and get_primaries untyped
        per_node = {node.name: set(admin.execute_command(  # type: ignore[no-untyped-call]
                        "PUBSUB", "SHARDCHANNELS", f"{prefix}:*", target_nodes=node))
                    for node in admin.get_primaries()}  # type: ignore[no-untyped-call]
        assert set().union(*per_node.values()) == {f"{prefix}:{ch}" for ch in channels}
        assert sum(1 for found in per_node.values() if found) > 1
        for sub in subs:
            await sub.__aexit__(None, None, None)
    finally:
        await bus.disconnect()


def _serve(redis_cluster: str, prefix: str, folder: Path, llm: OpenAIDouble, token: str) -> ServerProcess:
    node = redis_cluster.replace("redis+cluster://", "redis://")  # and --redis-cluster says what it is
    return start_server(folder, llm=llm, token=token, timeout=STARTUP,
                        args=["--no-demo", "--redis-url", node, "--redis-cluster", "--redis-prefix", prefix])


async def test_two_servers_share_worlds_on_a_redis_cluster(redis_cluster: str, tmp_path: Path,
                                                           llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(lambda body: Text("hello from the cluster"))
    prefix, token = unique_name(), "cluster-owner-token-of-at-least-32-characters"
    one = _serve(redis_cluster, prefix, tmp_path / "one", llm_double, token)
    try:
        two = _serve(redis_cluster, prefix, tmp_path / "two", llm_double, token)
        try:
            with client_for(one, token) as on_one, client_for(two, token) as on_two:
                worlds = [make_world(on_one, llm_double, name=f"Lab {i}") for i in range(3)]
                assert {w["id"] for w in on_two.get("/api/worlds").json()} >= set(worlds)
                for world in worlds:
                    async with ws_connect(two, world, token) as ws:
                        await replay_and_snapshot(ws)
                        posted = on_one.post(f"/api/worlds/{world}/messages", json={"content": "hi"})
                        assert posted.status_code == 201, posted.text
                        await read_until(ws, lambda f: f["type"] == "event" and f["event"].get("sender") == "alice",
                                         timeout=30)
                    events = wait_until(functools.partial(all_events, on_two, world), what="events")
                    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
                    assert [e["content"] for e in events if e.get("sender") == "alice"] == ["hello from the cluster"]
        finally:
            two.stop()
    finally:
        one.stop()
