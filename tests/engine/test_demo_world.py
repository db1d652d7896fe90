"""The offline demo world: scripted agents that stream, mention each other, ask for approval and use tools."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.demo import ensure_demo_world
from server.engine.engine import Engine
from tests.fixtures.engine import MEMBER, Harness, open_engine
from tests.fixtures.eventually import eventually_async


async def _wait(engine: Engine, world: str, predicate: Callable[[dict[str, Any]], Any],
                timeout: float = 10.0) -> list[dict[str, Any]]:
    async def found() -> list[dict[str, Any]]:
        return [e for e in await engine.events(world, 0, 10_000) if predicate(e)]
    return await eventually_async(found, timeout=timeout, what="a matching event")


async def test_the_demo_world_runs_offline_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    engine, close = await open_engine(tmp_path)
    try:
        world = await ensure_demo_world(engine)
        assert world is not None
        assert await ensure_demo_world(engine) is None  # only once
        agents = {a["name"]: a["provider"] for a in await engine.worlds.agents(world)}
        assert agents == {"alice": "scripted", "bob": "scripted"}
        chunks: list[dict[str, Any]] = []

        async def collect() -> None:
            async with engine.store.bus.subscribe(f"world:{world}") as sub:
                async for text in sub:
                    frame = json.loads(text)
                    if frame["type"] == "chunk":
                        chunks.append(frame)
        collector = asyncio.create_task(collect())
        await asyncio.sleep(0.05)
        await engine.post_message(world, MEMBER, "hello team")
        [approval] = await _wait(engine, world,
                                 lambda e: e.get("sender") == vocab.SERVER_SENDER and e.get("tool_calls"))
        approval_id = approval["tool_calls"][0]["id"]
        await engine.submit_tool_result(world, MEMBER, {"role": "tool", "tool_call_id": approval_id,
                                                        "content": json.dumps({"decision": "approve"})})
        # bob is mentioned by alice, reads notes.md without asking, then asks the browser to notify
        await _wait(engine, world, lambda e: e.get("role") == "tool" and e.get("name") == "file_read"
                    and "scripted" in (e.get("content") or ""))
        await _wait(engine, world, lambda e: e.get("client_calls"))
        [client_call] = await engine.pending_client_calls(world)
        assert client_call["agent"] == "bob" and client_call["name"] == "ui_notify"
        await engine.submit_tool_result(world, MEMBER, {"role": "tool", "tool_call_id": client_call["id"],
                                                        "content": '{"shown": true}'})
        await _wait(engine, world, lambda e: e.get("sender") == "bob" and e.get("role") == "assistant"
                    and e.get("content") and not e.get("tool_calls"))
        collector.cancel()
        assert len(chunks) > 5 and {c["agent"] for c in chunks} >= {"alice", "bob"}
    finally:
        await close()


async def test_different_agents_think_in_parallel(harness: Harness) -> None:
    from server.testing.openai_double import Delay, Text
    await harness.make_world("alice", "bob")
    harness.double.respond_with(lambda body: Delay(0.5, Text("slow answer")))
    await harness.say("both of you")
    await harness.idle(timeout=5)
    from datetime import datetime
    first_reply = min(datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
                      for e in await harness.events() if e.get("role") == "assistant")
    # bob's request reached the LLM before alice's answer came back (and the other way round)
    assert len(harness.double.requests) == 2
    assert max(r.received_at for r in harness.double.requests) < first_reply
