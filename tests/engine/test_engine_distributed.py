"""Two engines (two processes, as far as Redis can tell) sharing worlds through one Redis."""
from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from server.bus import Bus
from server.bus.base import Gap
from server.bus.redis import RedisBackend
from server.engine.engine import Engine
from server.engine.hosting.hosted import WORLDS_CHANNEL
from server.log.failures import StorageError
from server.log.redis.log import RedisLog
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.engine import MEMBER, OWNER, bus_refuses_once, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async
from tests.fixtures.redis_servers import RedisServer
from tests.fixtures.storage import delete_prefix, unique_name


class Cluster:
    def __init__(self, url: str, prefix: str, data_dir: Path) -> None:
        self.url, self.prefix, self.data_dir = url, prefix, data_dir
        self.engines: list[tuple[Engine, RedisLog, Bus]] = []

    async def engine(self) -> Engine:
        log = await RedisLog.open(self.url, self.prefix)
        bus = Bus(RedisBackend(self.url))
        await bus.connect()
        engine = Engine(log, bus, data_dir=self.data_dir, lease_ttl=1.5)
        await engine.start()
        self.engines.append((engine, log, bus))
        return engine

    async def stop(self, engine: Engine) -> None:
        for entry in list(self.engines):
            if entry[0] is engine:
                self.engines.remove(entry)
                await engine.stop(grace=1)
                await entry[2].disconnect()
                await entry[1].close()


@pytest.fixture
async def cluster(redis_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    prefix = unique_name()
    cluster = Cluster(redis_url, prefix, tmp_path)
    try:
        yield cluster
    finally:
        for engine, _, _ in list(cluster.engines):
            await cluster.stop(engine)
        delete_prefix(redis_url, prefix)


async def _wait(predicate: Callable[[], Any], timeout: float = 8.0) -> None:
    await eventually_async(predicate, timeout=timeout)


async def test_two_processes_share_a_world_and_run_each_turn_once(cluster: Cluster, llm_double: OpenAIDouble) -> None:
    a, b = await cluster.engine(), await cluster.engine()
    llm_double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x >> ran.txt"})),
                                          after_tools=Text("done")))
    world = (await a.create_world(OWNER, "shared", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    await _wait(lambda: _hosts(b, world))
    await b.post_message(world, MEMBER, "hello from b")
    await _wait(lambda: _has_pending(a, world))
    [pending] = await b.pending_approvals(world)
    decisions = await asyncio.gather(
        *(engine.submit_tool_result(world, MEMBER, {"role": "tool", "tool_call_id": pending["id"],
                                                    "content": json.dumps({"decision": "approve"})})
          for engine in (a, b, a, b)), return_exceptions=True)
    assert sum(isinstance(d, dict) for d in decisions) == 1
    await _wait(lambda: _said(a, world, "done"))
    await asyncio.sleep(0.3)
    assert len(llm_double.requests) == 2  # one LLM call per step, not one per process
    assert (a.workspace_for(world) / "ran.txt").read_text() == "x\n"


async def test_a_stopped_process_hands_its_agents_over(cluster: Cluster, llm_double: OpenAIDouble) -> None:
    a, b = await cluster.engine(), await cluster.engine()
    llm_double.respond_with(lambda body: Text("hi"))
    world = (await a.create_world(OWNER, "handover", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    await _wait(lambda: _hosts(b, world))
    await cluster.stop(a)  # its lease on alice is released: b takes over
    await b.post_message(world, MEMBER, "anyone there?")
    await _wait(lambda: _said(b, world, "hi"))


async def test_a_world_whose_hosting_the_storage_refused_once_gets_its_runners(
        cluster: Cluster, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """b heard of a's new world, started its listener, then could not read the world's agents (Redis
    gone a moment): the world counted as hosted, so b's retry skipped it, and b never ran its agents,
    not even once a was gone."""
    a, b = await cluster.engine(), await cluster.engine()
    llm_double.respond_with(lambda body: Text("hi"))
    created = asyncio.Event()
    refused: list[str] = []
    exists, agents = b.worlds.exists, b.worlds.agents

    async def after_creation(world: str) -> bool:
        await created.wait()  # b hosts the world once a has added its agent (not heard live by b then)
        return await exists(world)

    async def refusing_once(world: str) -> list[dict[str, Any]]:
        if not refused:
            refused.append(world)
            raise StorageError("Redis gone a moment")
        return await agents(world)
    monkeypatch.setattr(b.worlds, "exists", after_creation)
    monkeypatch.setattr(b.worlds, "agents", refusing_once)
    world = (await a.create_world(OWNER, "refused", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    created.set()
    await _wait(lambda: _hosts(b, world))
    await cluster.stop(a)  # its lease on alice is released: b takes over, if it runs alice at all
    await b.post_message(world, MEMBER, "anyone there?")
    await _wait(lambda: _said(b, world, "hi"))
    assert refused == [world]


async def test_a_message_whose_publish_failed_still_reaches_the_agent_another_process_runs(
        cluster: Cluster, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """b stored a person's message, then Redis refused its publish: a, which runs the agent, never heard
    of it (its own connection saw no gap), and the agent never answered."""
    a, b = await cluster.engine(), await cluster.engine()
    llm_double.respond_with(lambda body: Text("hi"))
    world = (await a.create_world(OWNER, "unheard", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    await _wait(lambda: _hosts(b, world))
    refused = bus_refuses_once(b, monkeypatch, lambda message: '"role":"user"' in message)
    await b.post_message(world, MEMBER, "anyone there?")
    await _wait(lambda: _said(a, world, "hi"))
    assert refused and len(llm_double.requests) == 1


async def test_a_message_stored_though_its_append_timed_out_still_reaches_the_agent_another_process_runs(
        cluster: Cluster, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis stored b's append but its answer was lost (a timeout): the person was told it failed, the
    message is in the log all the same, and nobody published it: a, which runs the agent, never heard."""
    a, b = await cluster.engine(), await cluster.engine()
    llm_double.respond_with(lambda body: Text("hi"))
    world = (await a.create_world(OWNER, "timed out", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    await _wait(lambda: _hosts(b, world))
    log = b.store.log
    lost: list[list[Any]] = []
    append_batch = log.append_batch

    async def answer_lost(world: str, items: Any) -> list[Any]:
        stored = await append_batch(world, items)
        if not lost and any(event.get("role") == "user" for event, _ in items):
            lost.append(stored)
            raise StorageError("Timeout reading from socket", may_have_stored=True)
        return stored
    monkeypatch.setattr(log, "append_batch", answer_lost)
    with pytest.raises(StorageError):
        await b.post_message(world, MEMBER, "anyone there?")
    await _wait(lambda: _said(a, world, "hi"))
    assert lost and len(llm_double.requests) == 1


async def test_a_process_whose_world_announcements_fell_behind_still_hosts_the_next_new_world(
        cluster: Cluster, llm_double: OpenAIDouble) -> None:
    """A burst of announcements (an import of many worlds) cut b's subscription off: its follower ended
    with the Overflow, and b never hosted another world until its restart."""
    a, b = await cluster.engine(), await cluster.engine()
    first = (await a.create_world(OWNER, "first"))["id"]
    await _wait(lambda: _hosts(b, first))
    for _ in range(10_001):  # all at once: more than the follower's queue holds
        b.store.bus.deliver_here(WORLDS_CHANNEL, first)
    second = (await a.create_world(OWNER, "second"))["id"]
    await _wait(lambda: _hosts(b, second), timeout=15)


async def _hosts(engine: Engine, world: str) -> bool:
    return engine.hosts(world)


async def _has_pending(engine: Engine, world: str) -> bool:
    return bool(await engine.pending_approvals(world))


async def _said(engine: Engine, world: str, text: str) -> bool:
    return any(e.get("content") == text and e.get("role") == "assistant" for e in await engine.events(world))


async def _restart_and_wait_until_back(redis_server: RedisServer, engine: Engine, world: str) -> None:
    """Restart Redis (from its last snapshot) and wait until `engine`'s bus says it is back."""
    async with engine.store.bus.subscribe(f"world:{world}") as sub:
        redis_server.restart()
        async with asyncio.timeout(10):
            while True:
                try:
                    await sub.get()
                except Gap as gap:
                    if not gap.down:
                        return


async def test_an_agent_answers_a_message_that_took_the_seq_of_one_the_storage_lost(
        private_redis: RedisServer, tmp_path: Path, llm_double: OpenAIDouble) -> None:
    """Redis came back from an older snapshot: the events after it were lost, and new ones take their
    seqs. The engine's listener had handled those seqs: it dropped each new event as one it had, and the
    agent never answered a message posted after the loss."""
    cluster = Cluster(private_redis.url, "aw", tmp_path)
    try:
        engine = await cluster.engine()
        llm_double.respond_with(lambda body: Text(f"re: {body['messages'][-1]['content']}"))
        world = (await engine.create_world(OWNER, "rewound", agents=[
            {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
        await engine.post_message(world, MEMBER, "kept")
        await _wait(lambda: _said(engine, world, "re: kept"))
        private_redis.client().save()  # the snapshot Redis comes back from
        for text in ("lost", "lost too"):
            await engine.post_message(world, MEMBER, text)
            await _wait(functools.partial(_said, engine, world, f"re: {text}"))
        await _restart_and_wait_until_back(private_redis, engine, world)
        assert not await _said(engine, world, "re: lost")  # gone with the events after the snapshot
        await asyncio.sleep(0.2)  # the listener's catch-up after the gap
        await engine.post_message(world, MEMBER, "after the loss")
        await _wait(lambda: _said(engine, world, "re: after the loss"))
    finally:
        for each, _, _ in list(cluster.engines):
            await cluster.stop(each)


async def test_an_agent_added_before_the_listener_caught_up_on_a_storage_loss_gets_a_runner(
        private_redis: RedisServer, tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis came back from an older snapshot, and an agent was added before the engine's listener caught
    up on the gap: its agent_added took the seq of a lost event the listener had handled, so the listener
    dropped it as one it had, and the agent never got a runner here: it never answered."""
    cluster = Cluster(private_redis.url, "aw", tmp_path)
    try:
        engine = await cluster.engine()
        llm_double.respond_with(lambda body: Text("hi"))
        world = (await engine.create_world(OWNER, "rewound"))["id"]
        private_redis.client().save()  # the snapshot Redis comes back from
        for text in ("lost", "lost too", "lost as well"):
            await engine.post_message(world, MEMBER, text)
        added, catch_up = asyncio.Event(), engine.hosting._catch_up

        async def late(world: str, handled: Any) -> None:  # the listener catches up once the agent is added
            await added.wait()
            await catch_up(world, handled)
        monkeypatch.setattr(engine.hosting, "_catch_up", late)
        await _restart_and_wait_until_back(private_redis, engine, world)
        await engine.add_agent(world, OWNER, {"name": "bob", "provider": "openai", "model": "m",
                                              "base_url": llm_double.base_url})
        added.set()
        await engine.post_message(world, MEMBER, "anyone there?")
        await _wait(lambda: _said(engine, world, "hi"))
    finally:
        for each, _, _ in list(cluster.engines):
            await cluster.stop(each)


async def test_a_rule_another_process_adds_in_the_seq_of_a_rule_the_storage_lost_is_in_force_here(
        private_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """a added a rule whose publish its own listener never heard (Redis took it, a's subscriber connection
    was away), then Redis came back from a snapshot before it. b's rule took that rule's seq: a took it
    for its own write, observed already, and kept the rules it had memoized, without b's."""
    cluster = Cluster(private_redis.url, "aw", tmp_path)
    try:
        a, b = await cluster.engine(), await cluster.engine()
        world = (await a.create_world(OWNER, "rewound"))["id"]
        await _wait(lambda: _hosts(b, world))
        private_redis.client().save()  # the snapshot Redis comes back from
        backend = a.store.bus.backend
        publish = backend.publish

        async def unheard(channel: str, message: str) -> None:
            if '"rule_added"' not in message:
                await publish(channel, message)
        monkeypatch.setattr(backend, "publish", unheard)
        await a.approvals.add_rule(world, OWNER, "lost_tool", None, "allow")
        monkeypatch.setattr(backend, "publish", publish)
        await _restart_and_wait_until_back(private_redis, a, world)
        await asyncio.sleep(0.2)  # the listeners' catch-up after the gap
        assert await a.rules(world) == []  # gone with the events after the snapshot, and memoized so
        rule = await b.approvals.add_rule(world, OWNER, "kept_tool", None, "allow")
        await _wait(lambda: _has_rule(a, world, rule["id"]))
    finally:
        for each, _, _ in list(cluster.engines):
            await cluster.stop(each)


async def _has_rule(engine: Engine, world: str, rule_id: str) -> bool:
    return any(rule["id"] == rule_id for rule in await engine.rules(world))
