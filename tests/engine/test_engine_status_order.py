"""The agent's `thinking` status is published beside its LLM request (not awaited before it), and still
reaches everyone before the reply's first streamed chunk."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from server import vocab
from server.engine.store import channel
from server.testing.openai_double import Status, Text
from tests.fixtures.engine import OWNER, Harness, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async


def _hold_first(harness: Harness, monkeypatch: pytest.MonkeyPatch,
                matches: Callable[[str], bool]) -> tuple[list[str], asyncio.Event]:
    """Hold the first published message that `matches` until the returned event is set (then publish it)."""
    backend, release = harness.engine.store.bus.backend, asyncio.Event()
    held: list[str] = []
    publish = backend.publish

    async def holding(name: str, message: str) -> None:
        if not held and matches(message):
            held.append(message)
            await release.wait()
        await publish(name, message)
    monkeypatch.setattr(backend, "publish", holding)
    return held, release


def _is_result(call_id: str, message: str) -> bool:
    return call_id in message and '"role":"tool"' in message and '"decision"' not in message


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


async def test_a_chunk_the_bus_missed_costs_the_reply_nothing(harness: Harness,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed text is for show, like a status: when the bus failed to publish one chunk (Redis dropped
    the connection a moment), the error ended the LLM call and the turn with an internal error, and the
    reply that the LLM gave was lost."""
    await harness.make_world("alice")
    harness.double.queue(Text("a reply streamed in several small chunks", chunk_size=4))
    backend = harness.engine.store.bus.backend
    missed: list[str] = []
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
    backend = harness.engine.store.bus.backend
    missed: list[str] = []
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
    held, release = _hold_first(harness, monkeypatch, lambda message: '"decision"' in message)
    deciding = asyncio.create_task(harness.decide(approval["id"]))
    try:
        await eventually_async(harness.results, timeout=20, what="the tool's result, its decision held on the bus",
                               accept=lambda results: call_id in results)
        assert held and not deciding.done()
    finally:
        release.set()
        await deciding


async def test_an_approved_tool_runs_while_its_running_status_is_still_being_published(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `running_tool` status goes out beside the tool, not before it (a busy bus held every approved
    tool 0.5-1 ms); its result still comes after that status, for every subscriber."""
    world = await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "touch ran"}))))
    await harness.say("run it")
    [approval] = await harness.wait_pending(1)
    call_id = approval["request"]["toolCallId"]
    held, release = _hold_first(harness, monkeypatch, lambda message: f'"state":"{vocab.RUNNING_TOOL}"' in message)
    ran = harness.engine.workspace_for(world) / "ran"
    frames: list[str] = []
    async with harness.engine.store.bus.subscribe(channel(world)) as sub:
        deciding = asyncio.create_task(harness.decide(approval["id"]))
        try:
            await eventually_async(ran.exists, timeout=20, what="the tool's run, its running status held on the bus")
            assert held and call_id not in await harness.results()
        finally:
            release.set()
            await deciding
        while not any(_is_result(call_id, frame) for frame in frames):
            frames.append(await sub.get())
    running = next(i for i, frame in enumerate(frames) if vocab.RUNNING_TOOL in frame)
    result = next(i for i, frame in enumerate(frames) if _is_result(call_id, frame))
    assert running < result, frames


async def test_a_tool_result_written_here_wakes_the_agent_before_its_echo_on_the_bus(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner of this process is woken as the result is stored, not once the bus brings it back:
    the next LLM request goes out while the result's publish is still held."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "true"})),
                                              Text("done")))
    await harness.say("run it")
    [approval] = await harness.wait_pending(1)
    call_id = approval["request"]["toolCallId"]
    asked = len(harness.double.requests)
    held, release = _hold_first(harness, monkeypatch, lambda message: _is_result(call_id, message))
    deciding = asyncio.create_task(harness.decide(approval["id"]))
    try:
        await eventually_async(lambda: len(harness.double.requests), timeout=20, accept=lambda n: n > asked,
                               what="the next LLM request, the tool's result held on the bus")
        assert held
    finally:
        release.set()
        await deciding
    await harness.wait_for(lambda e: e.get("sender") == "alice" and e.get("content") == "done")
