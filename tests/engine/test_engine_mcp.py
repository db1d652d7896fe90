"""Tools from a world's MCP servers (real ones, over stdio) go through the same approval flow."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from server import vocab
from server.errors import AppError
from tests.fixtures.engine import OWNER, Harness, reply_by_turn, tool_calls
from tests.fixtures.tools import ECHO_SERVER


async def test_trusted_mcp_tools_are_offered_and_follow_their_annotations(harness: Harness, tmp_path: Path) -> None:
    await harness.make_world("alice", mcp_servers=[{"name": "echo", "command": sys.executable, "args": [ECHO_SERVER],
                                                    "trusted": True}])
    info = await harness.engine.get_world(harness.world)
    tools = {t["name"]: t for t in info["tools"]}
    assert tools["echo__echo"]["requires_approval"] is False  # readOnlyHint
    assert tools["echo__count"]["requires_approval"] is True
    counter = harness.engine.workspace_for(harness.world) / "c.txt"
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("echo__echo", {"text": "ping"}),
                                                                 ("echo__count", {"path": str(counter)}))))
    await harness.say("use the echo server")
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["toolName"] == "echo__count"
    await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "echo__echo"
                           and "ping" in e.get("content", ""))
    await harness.decide(pending["id"])
    await harness.idle(timeout=10)
    assert counter.read_text().count("\n") == 1  # ran once, after the approval
    names = {t["function"]["name"] for t in harness.double.requests[0].body["tools"]}
    assert {"echo__echo", "echo__count", "shell_exec"} <= names


async def test_an_unsandboxed_mcp_server_yields_the_cpu_to_the_server(harness: Harness) -> None:
    """A trusted server runs unsandboxed, but it is still a tool process: a busy one must not take a core
    from every world's requests (its 20 MB result's JSON did, bench/isolation.py)."""
    await harness.make_world("alice", mcp_servers=[{"name": "echo", "command": sys.executable, "args": [ECHO_SERVER],
                                                    "trusted": True}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("echo__niceness", {}))))
    await harness.say("how nice are you?")
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "echo__niceness")
    assert int(result["content"]) == os.nice(0) + 10


async def test_an_unsandboxed_mcp_server_s_command_is_found_on_the_path_its_settings_give(harness: Harness,
                                                                                        tmp_path: Path) -> None:
    """Run under `nice`, the command is still looked for where the server's own `env` PATH says."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "my-python"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    launcher.chmod(0o755)
    await harness.make_world("alice", mcp_servers=[{"name": "echo", "command": "my-python", "args": [ECHO_SERVER],
                                                    "env": {"PATH": str(bin_dir)}, "trusted": True}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("echo__niceness", {}))))
    await harness.say("how nice are you?")
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "echo__niceness")
    assert int(result["content"]) == os.nice(0) + 10


async def test_bad_mcp_settings_are_refused(harness: Harness) -> None:
    await harness.make_world("alice")
    for servers in ([{"name": "a__b", "command": "x"}], [{"name": "ok"}], "nope",
                    [{"name": "x", "command": "y"}, {"name": "x", "command": "z"}]):
        with pytest.raises(AppError) as caught:
            await harness.engine.worlds.update(harness.world, OWNER, settings={"mcp_servers": servers})
        assert caught.value.code == vocab.INVALID
