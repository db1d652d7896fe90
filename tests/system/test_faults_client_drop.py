"""Issue #11 fault 1: a client that drops while its decision is being applied never cancels the engine's work."""
from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

import httpx2 as httpx

from server.backends import SQLITE_FILE
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, make_world, wait_until
from tests.fixtures.engine import tool_calls
from tests.fixtures.server import ServerProcess
from tests.fixtures.ws import replay_and_snapshot, ws_connect


def _respond(body: dict[str, Any]) -> Any:
    """alice runs what follows "run "; bob streams a long answer slowly (so every socket keeps writing)."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Text("done")
    content = last.get("content") or ""
    if "run " in content:
        return tool_calls(("shell_exec", {"command": content.split("run ", 1)[1]}))
    if "stream" in content:
        return Text("la " * 1500, chunk_size=3, delay=0.005)
    return Text("ok")


async def test_an_approve_whose_client_drops_mid_write_still_runs_the_tool(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(_respond)
    world = make_world(owner, llm_double, agents=("alice", "bob"))
    ran = server.data_dir / "workspaces" / world / "ran.txt"
    owner.post(f"/api/worlds/{world}/messages", json={"content": "@alice run echo x >> ran.txt"})
    approval = wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(),
                          what="a pending approval")[0]
    owner.post(f"/api/worlds/{world}/messages", json={"content": "@bob stream"})
    decision = {"role": "tool", "tool_call_id": approval["id"],
                "content": json.dumps({"decision": "approve", "scope": "once"})}
    async with ws_connect(server, world, server.token) as ws:
        await replay_and_snapshot(ws)
        await asyncio.wait_for(ws.recv(), 10)  # bob's stream reaches this socket: its writer keeps writing
        # Hold SQLite's write lock so the decision's append is in flight when the client vanishes.
        blocker = sqlite3.connect(server.data_dir / SQLITE_FILE, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            await ws.send(json.dumps({"type": "tool_result", "message": decision, "ref": 1}))
            await asyncio.sleep(0.4)
            ws.transport.abort()  # the client is gone (no closing handshake) while the server applies it
            await asyncio.sleep(0.6)  # the writer's next chunk finds the socket dead
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()

    def result() -> dict[str, Any] | None:
        calls = [e for e in all_events(owner, world) if e.get("role") == "tool" and not e.get("decision")
                 and e.get("tool_call_id") == approval["request"]["toolCallId"]]
        return calls[0] if calls else None

    outcome = wait_until(result, timeout=15, what="the approved call's result")
    assert "interrupted" not in outcome["content"], outcome
    assert ran.read_text() == "x\n"
    assert owner.get(f"/api/worlds/{world}/approvals/pending").json() == []
