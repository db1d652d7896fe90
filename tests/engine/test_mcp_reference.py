"""Against servers others wrote (issue #15): `mcp-server-time` (PyPI) over stdio in the sandbox, and the
reference `@modelcontextprotocol/server-everything` (npm) over stdio and streamable HTTP. The chain:
LLM double -> tool call -> approval or not, as trust and annotations say -> MCP call -> result back
to the LLM."""
from __future__ import annotations

import json
from typing import Any

from tests.fixtures.engine import OWNER, Harness, reply_by_turn, tool_calls
from tests.fixtures.mcp_reference import TIME_SERVER, everything_http, server_everything

__all__ = ["everything_http", "server_everything"]  # fixtures used by name below


def _tool_messages(harness: Harness) -> dict[str, str]:
    """What the LLM was sent as tool results, by tool name (from the double's requests)."""
    names: dict[str, str] = {}
    out: dict[str, str] = {}
    for request in harness.double.requests:
        for message in request.body["messages"]:
            for call in message.get("tool_calls") or ():
                names[call["id"]] = call["function"]["name"]
            if message["role"] == "tool" and message.get("tool_call_id") in names:
                out[names[message["tool_call_id"]]] = message["content"]
    return out


async def _run(harness: Harness, calls: list[tuple[str, dict[str, Any]]], asks: set[str]) -> dict[str, str]:
    """The LLM calls `calls` at once; exactly the `asks` tools wait for a person, who approves them."""
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(*calls)))
    await harness.say("use the tools")
    if asks:
        pending = await harness.wait_pending(len(asks), timeout=30)
        assert {p["request"]["toolName"] for p in pending} == asks
        for approval in pending:
            await harness.decide(approval["id"])
    await harness.idle(timeout=60)
    assert await harness.engine.pending_approvals(harness.world) == []
    seen = _tool_messages(harness)
    assert set(seen) == {name for name, _ in calls}, seen
    return seen


async def test_time_and_everything_over_stdio(harness: Harness, server_everything: str) -> None:
    await harness.make_world("alice", mcp_servers=[
        {"name": "time", "command": TIME_SERVER[0], "args": TIME_SERVER[1:]},  # untrusted, sandboxed
        {"name": "every", "command": "node", "args": [server_everything, "stdio"], "trusted": True}])
    status = (await harness.engine.get_world(harness.world))["mcp_status"]
    assert status["time"]["state"] == status["every"]["state"] == "up", status
    seen = await _run(harness, [
        ("time__get_current_time", {"timezone": "Europe/Paris"}),
        ("every__echo", {"message": "hello"}),  # readOnlyHint from a trusted server: runs at once
        ("every__get-structured-content", {"location": "New York"}),
        ("every__get-tiny-image", {}),
        ("every__get-sum", {"a": 2, "b": 40}),
    ], asks={"time__get_current_time"})  # an untrusted server's tools ask
    assert json.loads(seen["time__get_current_time"])["timezone"] == "Europe/Paris"
    assert seen["every__echo"] == "Echo: hello"
    assert "temperature" in seen["every__get-structured-content"]
    assert "[image image/png" in seen["every__get-tiny-image"] and "MCP logo" in seen["every__get-tiny-image"]
    assert "42" in seen["every__get-sum"]


async def test_everything_over_streamable_http_asks_when_untrusted(harness: Harness, everything_http: str) -> None:
    await harness.make_world("alice", mcp_servers=[
        {"name": "trusted", "url": everything_http, "trusted": True},
        {"name": "plain", "url": everything_http}])
    status = (await harness.engine.get_world(harness.world))["mcp_status"]
    assert status["trusted"]["state"] == status["plain"]["state"] == "up", status
    assert status["plain"]["transport"] == "http"
    seen = await _run(harness, [("trusted__echo", {"message": "over http"}), ("plain__get-sum", {"a": 1, "b": 2})],
                      asks={"plain__get-sum"})
    assert seen["trusted__echo"] == "Echo: over http"
    assert "3" in seen["plain__get-sum"]


async def test_everything_asks_a_person_through_the_queue(harness: Harness, server_everything: str) -> None:
    """server-everything's elicitation form (every field kind the spec allows) reaches the queue; the
    answer, checked against it, goes back and the tool's result reflects it."""
    await harness.make_world("alice", mcp_servers=[
        {"name": "every", "command": "node", "args": [server_everything, "stdio"], "trusted": True}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("every__trigger-elicitation-request", {}))))
    await harness.say("ask me")  # trusted, destructiveHint false: it runs without an approval, then asks
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    schema = question["elicitation"]["requestedSchema"]
    assert {"name", "email", "untitledMultipleSelectEnum", "titledSingleSelectEnum"} <= set(schema["properties"])
    answer = {"action": "accept", "content": {
        "name": "Max Mustermann", "check": True, "email": "max@example.com", "homepage": "https://example.com",
        "birthdate": "1990-05-17", "integer": 7, "number": 2.5, "untitledSingleSelectEnum": "Joey",
        "untitledMultipleSelectEnum": ["Piano", "Drums"], "titledSingleSelectEnum": "hero-3",
        "titledMultipleSelectEnum": ["fish-2"], "legacyTitledEnum": "pet-2"}}
    await harness.engine.submit_tool_result(harness.world, OWNER, {
        "role": "tool", "tool_call_id": question["tool_calls"][0]["id"], "content": json.dumps(answer)})
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool"
                                      and e.get("name") == "every__trigger-elicitation-request", timeout=15)
    assert "Max Mustermann" in result["content"] and "hero-3" in result["content"], result["content"]
