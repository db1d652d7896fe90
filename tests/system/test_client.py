"""The Python client (agent_world_client) against a real `agent-world serve`: replay, live events, acks,
decisions, and reconnecting across a server restart with no gap and no duplicate."""
from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from agent_world_client import Approval, Fatal, NotConnected, ProtocolError, WorldClient
from server.testing.openai_double import OpenAIDouble, Text, ToolCalls
from tests.fixtures.api import invite, make_world, wait_until
from tests.fixtures.server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


def _write_call(call_id: str, path: str = "notes.md") -> ToolCalls:
    return ToolCalls([(call_id, "file_write", json.dumps({"path": path, "content": "hi"}))])


async def _until(client: WorldClient, predicate: Any, timeout: float = 15.0) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        async for frame in client.frames():
            seen.append(frame)
            if predicate(frame):
                return seen
    raise AssertionError("the stream ended")


async def _asked(client: WorldClient) -> Approval:
    """Ask alice to write (her queued reply is a file_write call) and return the approval request."""
    await _until(client, lambda f: f["type"] == "snapshot")
    await client.say("write notes")
    await _until(client, lambda f: bool(client.state.pending))
    (approval,) = client.state.pending.values()
    return approval


def test_client_imports_nothing_of_the_server() -> None:
    for source in (ROOT / "agent_world_client").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(n.split(".")[0] in ("server", "web", "tests") for n in names), (source, names)


async def test_replay_then_live_events_in_seq_order(server: ServerProcess, owner: httpx.Client,
                                                    llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(Text("first answer"), Text("second answer"))
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": "one"}).status_code == 201
    wait_until(lambda: any(e.get("content") == "first answer"
                           for e in owner.get(f"/api/worlds/{world}/events").json()), what="the first answer")

    async with WorldClient(server.url, world, server.token) as client:
        replay = await _until(client, lambda f: f["type"] == "snapshot")
        replayed = [f["event"]["seq"] for f in replay if f["type"] == "event"]
        assert replayed == list(range(1, len(replayed) + 1))
        assert [a for a in client.state.agents] == ["alice"]
        ack = await client.say("two")
        assert ack.seq == replayed[-1] + 1 and ack.id
        live = await _until(client, lambda f: f["type"] == "event" and f["event"].get("content") == "second answer")
        chunks = "".join(f["delta"] for f in live if f["type"] == "chunk")
        assert "second answer" in chunks  # streamed before it was stored
        seqs = [f["event"]["seq"] for f in live if f["type"] == "event"]
        assert seqs == list(range(replayed[-1] + 1, replayed[-1] + 1 + len(seqs)))
        assert client.last_seq == seqs[-1]


async def test_replay_from_after_skips_what_the_caller_has(server: ServerProcess, owner: httpx.Client,
                                                           llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    async with WorldClient(server.url, world, server.token, after=2) as client:
        frames = await _until(client, lambda f: f["type"] == "snapshot")
        assert next(f["event"]["seq"] for f in frames if f["type"] == "event") == 3


async def test_decide_approves_and_a_second_decision_is_already_decided(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(_write_call("call_w1"), Text("written"))
    async with WorldClient(server.url, world, server.token) as client:
        approval = await _asked(client)
        assert (approval.agent, approval.tool, approval.arguments["path"]) == ("alice", "file_write", "notes.md")
        ack = await client.decide(approval.id, "approve", "once")
        assert ack.seq is not None
        with pytest.raises(ProtocolError) as refused:
            await client.decide(approval.id, "deny")
        assert refused.value.code == "already_decided"
        await _until(client, lambda f: f["type"] == "event" and f["event"].get("content") == "written")
        assert not client.state.pending


async def test_a_spectator_is_refused_with_forbidden(server: ServerProcess, owner: httpx.Client,
                                                     llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    token = invite(owner, world, "spectator", "sam")["token"]
    async with WorldClient(server.url, world, token) as client:
        with pytest.raises(ProtocolError) as refused:
            await client.say("hello")
        assert refused.value.code == "forbidden"


async def test_a_wrong_token_is_fatal(server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    with pytest.raises(Fatal, match="401"):
        await WorldClient(server.url, world, "x" * 40).start()


async def test_reconnects_after_a_restart_and_resumes_without_gap_or_duplicate(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    async with WorldClient(server.url, world, server.token, backoff=0.1, max_backoff=0.5) as client:
        first = await _until(client, lambda f: f["type"] == "snapshot")
        await asyncio.to_thread(server.stop)  # a graceful stop closes sockets with 1012
        lost = await _until(client, lambda f: f["type"] == "connection")
        assert lost[-1]["connected"] is False
        with pytest.raises(NotConnected):
            await client.say("while down")
        # While it is down, someone else's message lands in the log.
        await asyncio.to_thread(server.start)
        with httpx.Client(base_url=server.url, headers=server.headers) as again:
            assert again.post(f"/api/worlds/{world}/messages", json={"content": "meanwhile"}).status_code == 201
        back = await _until(client, lambda f: f["type"] == "event" and f["event"].get("content") == "meanwhile")
        assert {"type": "connection", "connected": True} in back
        seqs = [f["event"]["seq"] for f in first + lost + back if f["type"] == "event"]
        assert seqs == list(range(1, len(seqs) + 1))  # no gap, no duplicate
        assert client.reconnects == 1
        assert (await client.say("after")).seq > seqs[-1]  # sends again once connected


async def test_decide_can_edit_the_arguments_before_approving(server: ServerProcess, owner: httpx.Client,
                                                              llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(_write_call("call_e1"), Text("written"))
    async with WorldClient(server.url, world, server.token) as client:
        approval = await _asked(client)
        await client.decide(approval.id, "approve", "once", arguments={"path": "edited.md"})
        frames = await _until(client, lambda f: f["type"] == "event" and f["event"].get("name") == "file_write")
    assert '"path": "edited.md"' in frames[-1]["event"]["content"]  # the tool ran with the edited path


async def test_a_request_needing_two_approvals_stays_pending_after_the_first(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    rule = owner.post(f"/api/worlds/{world}/rules",
                      json={"tool": "file_write", "effect": "ask", "approvals_required": 2})
    assert rule.status_code == 201, rule.text
    maria, carol = (invite(owner, world, "member", name)["token"] for name in ("maria", "carol"))
    llm_double.queue(_write_call("call_two"), Text("written"))
    async with WorldClient(server.url, world, maria) as first, WorldClient(server.url, world, carol) as second:
        approval = await _asked(first)  # maria asks: she may not count, so the owner and carol approve
        assert approval.required == 2 and approval.approved_by == ()
        await _until(second, lambda f: approval.id in second.state.pending)
        with pytest.raises(ProtocolError) as refused:
            await first.decide(approval.id, "approve")
        assert refused.value.code == "forbidden"
        await second.decide(approval.id, "approve")
        await _until(first, lambda f: first.state.pending[approval.id].approved_by == ("human:carol",))
        async with WorldClient(server.url, world, server.token) as late:  # a snapshot tells the same
            await _until(late, lambda f: f["type"] == "snapshot")
            assert late.state.pending[approval.id].approved_by == ("human:carol",)
            await late.decide(approval.id, "approve")
        await _until(first, lambda f: f["type"] == "event" and f["event"].get("content") == "written")
        assert not first.state.pending
