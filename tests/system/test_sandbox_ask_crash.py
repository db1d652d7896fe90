"""The `ask` network mode across a crash (issue #33): a connection waiting for a person when the server
is killed leaves its request in the queue; the restarted server reports the call interrupted and the
request goes with it, denied, instead of staying there for good (deciding it answered `already_decided`).
No namespace of its own is needed: a connection asks before any name is looked up."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, make_world, wait_until
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.server import start_server

FETCH = "import urllib.request; urllib.request.urlopen('https://api.example.com/', timeout=120)"
APPROVE = json.dumps({"decision": "approve", "scope": "once"})


def test_a_request_left_by_a_killed_server_is_closed_when_it_comes_back(
        llm_double: OpenAIDouble, tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", llm=llm_double)
    try:
        with client_for(server, server.token) as owner:
            world = make_world(owner, llm_double)
            assert owner.patch(f"/api/worlds/{world}", json={"settings": {"sandbox_network": "ask"}}).status_code == 200
            command = f"python3 -c {shlex.quote(FETCH)}"
            llm_double.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": command, "timeout": 120}))))
            assert owner.post(f"/api/worlds/{world}/messages", json={"content": "go"}).status_code == 201

            def pending(tool: str) -> dict[str, object] | None:
                entries = owner.get(f"/api/worlds/{world}/approvals/pending").json()
                return next((e for e in entries if e["request"]["toolName"] == tool), None)
            shell = wait_until(lambda: pending("shell_exec"), 30, what="the shell call's request")
            answer = owner.post(f"/api/worlds/{world}/tool-results", json={
                "role": "tool", "tool_call_id": shell["id"], "content": APPROVE})
            assert answer.status_code in (200, 201), answer.text
            asked = wait_until(lambda: pending("network"), 30, what="the connection's request")
        server.kill()
        server.restart()
        with client_for(server, server.token) as owner:
            def decided() -> list[dict[str, object]] | None:
                audit = owner.get(f"/api/worlds/{world}/audit", params={"limit": 1000}).json()
                found = [e for e in audit if e["action"] == "decided" and e["approval_id"] == asked["id"]]
                return found or None
            [closed] = wait_until(decided, 60, what="the orphaned request closed")
            assert closed["decision"] == "deny" and closed["reason"] == "the command ended before anyone decided"
            assert owner.get(f"/api/worlds/{world}/approvals/pending").json() == []
    finally:
        server.stop()
