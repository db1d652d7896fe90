"""The agent's `thinking` status is published beside its LLM request (not awaited before it), and still
reaches everyone before the reply's first streamed chunk."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from server import vocab
from server.engine.store import channel
from server.testing.openai_double import Status, Text
from tests.fixtures.engine import OWNER, Harness, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async


async def _statuses_and_chunks_of_a_reply(harness: Harness, world: str) -> list[str]:
    frames: list[dict[str, Any]] = []
    async with harness.engine.store.bus.subscribe(channel(world)) as sub:
        await harness.say("hello?")
        while not any(f.get("type") == "event" and f["event"].get("sender") == "alice"
                      for f in frames):
            frames.append(json.loads(await sub.get()))
    return [f"{f['type']}:{f.get('state', '')}" for f in frames if f["type"] in ("status", "chunk")]


async def test_the_thinking_status_comes_before_the_first_chunk_of_the_reply(harness: Harness) -> None:
    world = await harness.make_world("alice")
    harness.double.queue(Text("a reply streamed in several small chunks", chunk_size=4))
    kinds = await _statuses_and_chunks_of_a_reply(harness, world)
    assert "status:thinking" in kinds and "chunk:" in kinds, kinds
    assert kinds.index("status:thinking") < kinds.index("chunk:"), kinds


async def test_so_it_does_with_a_provider_that_streams_before_it_awaits_anything(harness: Harness) -> None:
    # The scripted (demo) provider hands its first chunk over before any I/O.
    info = await harness.engine.create_world(OWNER, "Scripted", agents=[
        {"name": "alice", "provider": "scripted", "model": "demo"}])
    harness.world = info["id"]
    kinds = await _statuses_and_chunks_of_a_reply(harness, info["id"])
    assert "status:thinking" in kinds and "chunk:" in kinds, kinds
    assert kinds.index("status:thinking") < kinds.index("chunk:"), kinds


async def test_a_chunk_the_bus_missed_costs_the_reply_nothing(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed text is for show, like a status: when the bus failed to publish one chunk (Redis dropped
    the connection a moment), the error ended the LLM call and the turn with an internal error, and the
    reply that the LLM gave was lost."""
    await harness.make_world("alice")
    harness.double.queue(Text("a reply streamed in several small chunks", chunk_size=4))
    backend, missed = harness.engine.store.bus.backend, []
    publish = backend.publish

    async def failing_once(name: str, message: str) -> None:
        if not missed and message.startswith('{"type":"chunk"'):
            missed.append(message)
            raise ConnectionError("cannot publish to Redis: connection reset")
        await publish(name, message)
    monkeypatch.setattr(backend, "publish", failing_once)
    await harness.say("hello?")
    await harness.wait_for(lambda e: e.get("sender") == "alice" and e.get("content") == "a reply streamed in several "
                                                                                       "small chunks")
    assert missed and not [e for e in await harness.events() if e.get("kind") == vocab.AGENT_ERROR]


async def test_a_retry_notice_the_bus_missed_costs_the_reply_nothing(harness: Harness,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM failed once (a 503) and was tried again; publishing the retry's reset chunk failed (Redis
    dropped the connection a moment): the error ended the LLM call and the turn with an internal error,
    and the reply the second try gave was lost."""
    await harness.make_world("alice")
    harness.double.queue(Status(503), Text("fine after all"))
    backend, missed = harness.engine.store.bus.backend, []
    publish = backend.publish

    async def failing_once(name: str, message: str) -> None:
        if not missed and '"reset":true' in message:
            missed.append(message)
            raise ConnectionError("cannot publish to Redis: connection reset")
        await publish(name, message)
    monkeypatch.setattr(backend, "publish", failing_once)
    await harness.say("hello?")
    await harness.wait_for(lambda e: e.get("sender") == "alice" and e.get("content") == "fine after all")
    assert missed and not [e for e in await harness.events() if e.get("kind") == vocab.AGENT_ERROR]


async def test_an_approved_tool_runs_while_its_decision_is_still_being_published(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision's write starts the call; its run (the `began` write, the tool, its result) does not
    wait for the bus too: a round trip to Redis less between a decision and its result."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "true"}))))
    await harness.say("run it")
    [approval] = await harness.wait_pending(1)
    call_id = approval["request"]["toolCallId"]
    backend, held, release = harness.engine.store.bus.backend, [], asyncio.Event()
    publish = backend.publish

    async def holding_the_decision(name: str, message: str) -> None:
        if '"decision"' in message and not held:
            held.append(message)
            await release.wait()
        await publish(name, message)
    monkeypatch.setattr(backend, "publish", holding_the_decision)
    deciding = asyncio.create_task(harness.decide(approval["id"]))
    try:
        await eventually_async(harness.results, timeout=20, what="the tool's result, its decision held on the bus",
                               accept=lambda results: call_id in results)
        assert held and not deciding.done()
    finally:
        release.set()
        await deciding
