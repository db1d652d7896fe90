"""A world is hosted while it has work and released when idle (issue #30): start-up hosts the worlds of
the log's work index, not every world; a message, a decision or a socket hosts any other on demand."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from server.engine.engine import Engine
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.engine import MEMBER, OWNER, RedisEngines, open_engine, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async


def _agent(double: OpenAIDouble) -> dict[str, str]:
    return {"name": "alice", "provider": "openai", "model": "m", "base_url": double.base_url}


async def _world(engine: Engine, double: OpenAIDouble, name: str, **settings: object) -> str:
    world: str = (await engine.create_world(OWNER, name, settings or None, agents=[_agent(double)]))["id"]
    return world


async def _said(engine: Engine, world: str, text: str) -> bool:
    return any(e.get("role") == "assistant" and e.get("content") == text for e in await engine.events(world))


async def test_a_restart_hosts_the_world_with_a_pending_request_not_the_idle_one_and_its_timeout_fires(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x >> ran.txt"})),
                                          after_tools=Text("noted")))
    engine, close = await open_engine(tmp_path)
    try:
        busy = await _world(engine, llm_double, "Busy", approval_timeout=2)
        idle = await _world(engine, llm_double, "Idle")
        await engine.post_message(busy, MEMBER, "go")
        await eventually_async(lambda: engine.pending_approvals(busy), timeout=10, what="a pending request")
    finally:
        await close()
    engine, close = await open_engine(tmp_path)
    try:
        assert engine.hosts(busy) and not engine.hosts(idle)
        assert await engine.store.log.worlds_with_work() == [busy]
        events = await eventually_async(lambda: engine.events(busy), timeout=15, what="the request to time out",
                                        accept=lambda events: any(e.get("content") == "noted" for e in events))
        [decision] = [e for e in events if e.get("decision")]
        assert decision["decision"]["timeout"] is True
        assert not (tmp_path / "workspaces" / busy / "ran.txt").exists()
    finally:
        await close()


async def test_an_idle_world_is_hosted_on_demand_when_a_message_is_posted(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(lambda body: Text("hello"))
    engine, close = await open_engine(tmp_path)
    try:
        world = await _world(engine, llm_double, "Quiet")
    finally:
        await close()
    engine, close = await open_engine(tmp_path)
    try:
        assert not engine.hosts(world)
        await engine.post_message(world, MEMBER, "hi")
        await eventually_async(lambda: _said(engine, world, "hello"), timeout=10, what="alice's answer")
        assert engine.hosts(world)
    finally:
        await close()


async def test_a_socket_keeps_an_idle_world_hosted_and_it_is_released_after_the_grace_period(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(lambda body: Text("hello"))
    engine, close = await open_engine(tmp_path, release_after=0.2)
    try:
        world = await _world(engine, llm_double, "Watched")
        await eventually_async(lambda: not engine.hosts(world), timeout=10, what="the new idle world released")
        async with engine.subscribe(world):
            assert engine.hosts(world)  # a page or a JSON socket on it: hosted while it is open
            await engine.post_message(world, MEMBER, "hi")
            await eventually_async(lambda: _said(engine, world, "hello"), timeout=10, what="alice's answer")
            assert engine.hosts(world)
        await eventually_async(lambda: not engine.hosts(world), timeout=10, what="the world released once idle")
        assert await engine.store.log.worlds_with_work() == []
    finally:
        await close()


async def test_a_world_with_a_pending_request_is_not_released(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "true"})),
                                          after_tools=Text("noted")))
    engine, close = await open_engine(tmp_path, release_after=0.2)
    try:
        busy = await _world(engine, llm_double, "Busy")
        await engine.post_message(busy, MEMBER, "go")
        [pending] = await eventually_async(lambda: engine.pending_approvals(busy), timeout=10, what="a request")
        idle = await _world(engine, llm_double, "Idle")  # created after the request's last event
        await eventually_async(lambda: not engine.hosts(idle), timeout=10, what="the idle world released")
        assert engine.hosts(busy)
        await engine.submit_tool_result(busy, MEMBER, {"role": "tool", "tool_call_id": pending["id"],
                                                       "content": json.dumps({"decision": "approve"})})
        await eventually_async(lambda: _said(engine, busy, "noted"), timeout=10, what="the turn's end")
        await eventually_async(lambda: not engine.hosts(busy), timeout=10, what="the busy world released once done")
    finally:
        await close()


async def test_work_started_in_a_process_that_dies_is_taken_over_by_another_that_had_released_the_world(
        redis_engines: RedisEngines, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x >> ran.txt"})),
                                          after_tools=Text("noted")))
    a = await redis_engines.start(lease_ttl=1.5, release_after=600)
    b = await redis_engines.start(lease_ttl=1.5, release_after=0.2)
    world = await _world(a, llm_double, "Shared", approval_timeout=3)
    await eventually_async(lambda: b.hosts(world), timeout=8, what="b to host the new world")
    await eventually_async(lambda: not b.hosts(world), timeout=8, what="b to release it, idle")
    async with a.subscribe(world):  # a's page keeps it hosted there
        await a.post_message(world, MEMBER, "go")  # its first work: into the index, and b hears of it
        await eventually_async(lambda: b.hosts(world), timeout=8, what="b to host the world with work")
        await eventually_async(lambda: a.pending_approvals(world), timeout=10, what="a pending request")
        await redis_engines.stop(a, grace=0)
    events = await eventually_async(lambda: b.events(world), timeout=20, what="b to time the request out",
                                    accept=lambda events: any(e.get("content") == "noted" for e in events))
    [decision] = [e for e in events if e.get("decision")]
    assert decision["decision"]["timeout"] is True


async def test_reading_an_idle_world_hosts_it_so_its_tools_follow_its_settings(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    engine, close = await open_engine(tmp_path)
    try:
        world = await _world(engine, llm_double, "Networked", sandbox_network=True)
        expected = {t["name"]: t for t in (await engine.get_world(world))["tools"]}
    finally:
        await close()
    engine, close = await open_engine(tmp_path)
    try:
        assert not engine.hosts(world)
        info = await engine.get_world(world)
        assert engine.hosts(world)
        assert {t["name"]: t for t in info["tools"]} == expected
    finally:
        await close()


async def test_a_world_hosted_again_while_it_is_being_released_keeps_its_settings(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    """Found by review: a release's end (closing the world's tools, forgetting its status) ran after a
    message or a socket had hosted the world again, which then ran without its MCP servers and with
    default settings (`sandbox_network` off) until the next settings change."""
    engine, close = await open_engine(tmp_path)
    try:
        world = (await engine.create_world(OWNER, "Busy", {"sandbox_network": True}, agents=[
            {**_agent(llm_double), "name": f"agent{n}"} for n in range(5)]))["id"]
        expected = {t["name"]: t for t in (await engine.get_world(world))["tools"]}
        releasing = asyncio.create_task(engine.hosting.unhost(world))
        await asyncio.sleep(0)  # the release is under way: its runners are stopping
        await engine.host(world)  # a message or a socket, meanwhile
        await releasing
        assert engine.hosts(world)
        assert {t["name"]: t for t in (await engine.get_world(world))["tools"]} == expected
    finally:
        await close()


async def test_a_process_that_released_a_world_reads_its_agents_and_chats_anew(
        redis_engines: RedisEngines, llm_double: OpenAIDouble) -> None:
    # Nothing tells a process of a world it does not host: what it remembered of it must go with it.
    a = await redis_engines.start(release_after=600)
    b = await redis_engines.start(release_after=0.2)
    world = await _world(a, llm_double, "Shared")
    await eventually_async(lambda: b.hosts(world), timeout=8, what="b to host the new world")
    assert [agent["name"] for agent in await b.worlds.agents(world)] == ["alice"]
    assert len(await b.worlds.chats(world)) == 1
    await eventually_async(lambda: not b.hosts(world), timeout=8, what="b to release it, idle")
    for name in ("bob", "carol"):  # each read here, then a change there: never an answer from before it
        await a.add_agent(world, OWNER, {**_agent(llm_double), "name": name})
        chat = await a.create_chat(world, OWNER, title=f"With {name}")
        assert not b.hosts(world)
        assert [agent["name"] for agent in await b.worlds.agents(world)][-1] == name
        assert chat["id"] in [c["id"] for c in await b.worlds.chats(world)]
