"""MCP annotations only count from a trusted server (issue #15, policy): an untrusted server's tools all
ask and none is re-run after a crash; a trusted server's hints decide; the owner's per-tool overrides
win over both, and owner rules still come first. Real servers over stdio, one engine."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.errors import AppError
from tests.fixtures.engine import OWNER, Harness, reply_by_turn, tool_calls

HINTS_SERVER = str(Path(__file__).parents[1] / "fixtures" / "mcp_hints_server.py")

# tool: (asks when trusted, re-run after a crash when trusted); untrusted: always (True, False)
TRUSTED = {
    "read_only": (False, True),  # readOnlyHint: true
    "destructive": (True, False),  # destructiveHint: true
    "additive": (False, False),  # destructiveHint: false
    "idempotent": (False, True),  # destructiveHint: false, idempotentHint: true
    "contradictory": (True, False),  # readOnlyHint and destructiveHint: only tightens
    "unannotated": (True, False),  # the spec's defaults: not read-only, destructive
    "lie": (False, True),  # claims readOnlyHint (and writes): the trusted owner's word is taken
}


def _server(name: str, trusted: bool, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": sys.executable, "args": [HINTS_SERVER], "trusted": trusted, **extra}


async def _tools(harness: Harness) -> dict[str, Any]:
    return await harness.engine.tools_for(harness.world, "alice")


async def test_each_hint_counts_only_from_a_trusted_server(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=[_server("u", False), _server("t", True)])
    tools = await _tools(harness)
    info = {t["name"]: t for t in (await harness.engine.get_world(harness.world))["tools"]}
    for tool, (asks, idempotent) in TRUSTED.items():
        untrusted, trusted = tools[f"u__{tool}"], tools[f"t__{tool}"]
        assert (untrusted.requires_approval, untrusted.idempotent, untrusted.read_only) == (True, False, False), tool
        assert (trusted.requires_approval, trusted.idempotent) == (asks, idempotent), tool
        assert info[f"t__{tool}"]["requires_approval"] is asks, tool
        assert info[f"u__{tool}"]["requires_approval"] is True, tool


async def test_a_lying_untrusted_server_asks_before_it_writes(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=[_server("u", False), _server("t", True)])
    workspace = harness.engine.workspace_for(harness.world)
    untrusted, trusted = workspace / "u.txt", workspace / "t.txt"
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("u__lie", {"path": str(untrusted)}),
                                                                 ("t__lie", {"path": str(trusted)}))))
    await harness.say("use both")
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["toolName"] == "u__lie"
    await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__lie"
                           and "1 lines" in e.get("content", ""), timeout=10)
    assert not untrusted.exists()  # the untrusted claim of readOnlyHint let nothing run
    await harness.decide(pending["id"])
    await harness.idle(timeout=10)
    assert untrusted.read_text() == "x\n"


async def test_owner_overrides_win_over_trust_and_hints(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=[
        _server("u", False, tools={"read_only": {"approval": "never"}, "destructive": {"idempotent": True}}),
        _server("t", True, tools={"read_only": {"approval": "ask"}, "idempotent": {"idempotent": False},
                                  "unannotated": {"approval": "never", "idempotent": True}})])
    tools = await _tools(harness)
    assert not tools["u__read_only"].requires_approval and not tools["u__read_only"].idempotent
    assert tools["u__destructive"].requires_approval and tools["u__destructive"].idempotent
    assert tools["t__read_only"].requires_approval and not tools["t__read_only"].read_only
    assert tools["t__read_only"].idempotent  # only the approval was overridden
    assert not tools["t__idempotent"].requires_approval and not tools["t__idempotent"].idempotent
    assert not tools["t__unannotated"].requires_approval and tools["t__unannotated"].idempotent
    assert tools["u__lie"].requires_approval  # tools without an override keep the server's policy
    stored = (await harness.engine.get_world(harness.world))["settings"]["mcp_servers"][1]["tools"]
    assert stored["unannotated"] == {"approval": "never", "idempotent": True}


async def test_an_owner_rule_lets_an_untrusted_tool_run_without_asking(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=[_server("u", False)])
    await harness.engine.approvals.add_rule(harness.world, OWNER, "u__destructive", None, "allow")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("u__destructive", {"text": "hi"}))))
    await harness.say("go")
    await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "u__destructive"
                           and e.get("content") == "hi", timeout=10)
    assert await harness.engine.pending_approvals(harness.world) == []


@pytest.mark.parametrize("tools", [
    "ask", {"x": "ask"}, {"x": {"approval": "maybe"}}, {"x": {"idempotent": "yes"}}, {"x": {"other": 1}}, {"": {}}])
async def test_bad_tool_overrides_are_refused(harness: Harness, tools: object) -> None:
    await harness.make_world("alice")
    with pytest.raises(AppError) as caught:
        await harness.engine.worlds.update(harness.world, OWNER, settings={"mcp_servers": [
            {"name": "x", "command": "y", "tools": tools}]})
    assert caught.value.code == vocab.INVALID
