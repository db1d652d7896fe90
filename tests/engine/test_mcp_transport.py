"""MCP sessions (issue #15, transports): stdio and streamable HTTP, one session per server per world,
restarted with backoff when it dies, its state in `GET /api/worlds/{w}` (`mcp_status`), stopped with
the world. Calls: a per-call timeout, a hung server blocks no other call, a crash mid-call is a clear
error. Real servers: tests/fixtures/mcp_trouble_server.py over stdio and over HTTP."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.engine.store import channel
from server.tools.base import ToolContext, ToolError
from server.tools.mcp.masking import MASK
from server.tools.mcp.tools import McpServerConfig, McpTools
from tests.fixtures.engine import OWNER, Harness, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async
from tests.fixtures.mcp_trouble import TROUBLE, http_trouble, start_http
from tests.fixtures.server import free_port

TOKEN = secrets.token_hex(16)


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """The trouble server over streamable HTTP, requiring `Authorization: Bearer TOKEN`."""
    with http_trouble("--token", TOKEN) as url:
        yield url


def _never_ask(*tools: str) -> dict[str, Any]:
    return {tool: {"approval": "never"} for tool in tools}


async def _wait_state(harness: Harness, server: str, state: str, timeout: float = 15) -> dict[str, Any]:
    async def status() -> dict[str, Any]:
        found: dict[str, Any] = (await harness.engine.get_world(harness.world))["mcp_status"][server]
        return found

    return await eventually_async(status, accept=lambda found: found["state"] == state, timeout=timeout,
                                  what=f"{server} to be {state}")


async def test_an_http_server_gets_its_headers_which_no_client_reads_back(harness: Harness, http_server: str) -> None:
    await harness.make_world("alice", mcp_servers=[
        {"name": "web", "url": http_server, "headers": {"Authorization": f"Bearer {TOKEN}"},
         "tools": _never_ask("echo")}])
    info = await harness.engine.get_world(harness.world)
    assert info["mcp_status"]["web"]["state"] == "up" and info["mcp_status"]["web"]["transport"] == "http"
    assert info["settings"]["mcp_servers"][0]["headers"] == {"Authorization": MASK}
    assert TOKEN not in str(info) and TOKEN not in str(await harness.events())
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("web__echo", {"text": "over http"}))))
    await harness.say("echo it")
    await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("content") == "over http", timeout=10)
    # Sent back masked, the header keeps its stored value.
    shown = info["settings"]["mcp_servers"]
    await harness.engine.worlds.update(harness.world, OWNER, settings={"mcp_servers": [{**shown[0], "tools": {}}]})
    await _wait_state(harness, "web", "up")
    assert {"web__echo", "web__hang"} <= {t["name"] for t in (await harness.engine.get_world(harness.world))["tools"]}


async def test_an_http_server_refusing_the_headers_is_failed_with_the_reason(harness: Harness,
                                                                            http_server: str) -> None:
    await harness.make_world("alice", mcp_servers=[{"name": "web", "url": http_server,
                                                    "headers": {"Authorization": "Bearer wrong"}}])
    status = await _wait_state(harness, "web", "failed")
    assert "HTTP 401" in status["reason"] and "HTTP 401" in status["stderr_tail"], status
    info = await harness.engine.get_world(harness.world)
    assert "web" in info["tool_errors"] and not any(t["name"].startswith("web__") for t in info["tools"])


def _trouble(name: str = "t") -> McpServerConfig:
    return McpServerConfig(name=name, command=sys.executable, args=[TROUBLE], trusted=True)


async def test_a_crash_mid_call_is_a_clear_error_and_the_server_comes_back(tool_context: ToolContext) -> None:
    async with McpTools([_trouble()], restart_delay=0.2) as mcp:
        tools = {t.name: t for t in mcp.tools()}
        assert tools["t__pid"].run is not None and tools["t__crash"].run is not None
        first = await tools["t__pid"].run({}, tool_context)
        with pytest.raises(ToolError, match=r"^interrupted: MCP server 't' ended during 'crash'"):
            await tools["t__crash"].run({}, tool_context)
        await eventually_async(lambda: mcp.status()["t"], timeout=15, what="the server to restart and be up",
                               accept=lambda status: status["restarts"] >= 1 and status["state"] == "up")
        last_error = mcp.status()["t"]["last_error"]
        assert "closed the connection" in last_error["reason"] and "about to crash" in last_error["stderr_tail"]
        tools = {t.name: t for t in mcp.tools()}
        assert tools["t__pid"].run is not None
        assert await tools["t__pid"].run({}, tool_context) != first


async def test_a_hung_call_times_out_and_blocks_no_other_call(tool_context: ToolContext) -> None:
    async with McpTools([_trouble()], call_timeout=3) as mcp:
        tools = {t.name: t for t in mcp.tools()}
        hang, echo = tools["t__hang"].run, tools["t__echo"].run
        assert hang is not None and echo is not None
        hung = asyncio.ensure_future(hang({}, tool_context))  # a task: the runner returns a coroutine
        await asyncio.sleep(0)  # the hung call is sent first
        assert await echo({"text": "still answering"}, tool_context) == "still answering"
        assert not hung.done()  # the echo was answered while the hung call still waited
        with pytest.raises(ToolError, match=r"'hang' on 't' timed out after 3s"):
            await hung


async def test_the_world_setting_mcp_timeout_bounds_a_call(harness: Harness) -> None:
    await harness.make_world("alice", mcp_timeout=1, mcp_servers=[
        {"name": "t", "command": sys.executable, "args": [TROUBLE], "tools": _never_ask("hang")}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__hang", {}))))
    await harness.say("hang")
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__hang", timeout=10)
    assert "timed out after 1s" in result["content"]


async def test_a_server_starts_when_needed_and_stops_with_its_world(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                    "trusted": True, "tools": _never_ask("pid")}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__pid", {}))))
    await harness.say("pid?")
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__pid", timeout=10)
    pid = int(result["content"])
    assert (await harness.engine.get_world(harness.world))["mcp_status"]["t"]["state"] == "up"
    await harness.engine.worlds.delete(harness.world, OWNER)
    await eventually_async(lambda: not _running(pid), timeout=10, what="the MCP server to end with its world")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split(")")[-1].split()[0] != "Z"


async def test_stopping_a_running_mcp_call_sends_notifications_cancelled(harness: Harness, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled.txt"
    await harness.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                    "trusted": True, "tools": _never_ask("hang", "echo")}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__hang", {"marker": str(marker)}))))
    await harness.say("hang")
    await harness.wait_for(lambda e: e.get("kind") == "tool_started", timeout=10)
    await eventually_async(lambda: harness.engine.cancel_tool(harness.world, OWNER, "alice"), timeout=10,
                           what="the call to run, so that it can be stopped")
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__hang", timeout=10)
    assert "stopped" in result["content"], result
    # The server heard notifications/cancelled and stopped its handler.
    await eventually_async(marker.exists, timeout=10, what="the server to be told of the cancel")
    assert marker.read_text() == "cancelled"
    echo = (await harness.engine.tools_for(harness.world, "alice"))["t__echo"]  # the session goes on
    assert echo.run is not None
    assert await echo.run({"text": "still up"}, ToolContext(harness.world, "alice", "main", tmp_path)) == "still up"


async def test_progress_notifications_show_on_the_running_step(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                    "tools": _never_ask("progress")}])
    frames: list[dict[str, Any]] = []
    async with harness.engine.store.bus.subscribe(channel(harness.world)) as sub:
        harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__progress", {"steps": 3}))))
        await harness.say("go")
        while not any(f.get("type") == "event" and f["event"].get("name") == "t__progress" for f in frames):
            frames.append(json.loads(await asyncio.wait_for(sub.get(), 15)))
    shown = [f["progress"] for f in frames if f.get("type") == "status" and f.get("progress")]
    assert [(p["progress"], p["total"], p["message"]) for p in shown] == [(1, 3, "step 1"), (2, 3, "step 2"),
                                                                          (3, 3, "step 3")]
    assert all(f["state"] == "running_tool" and f["tool"] == "t__progress"
               for f in frames if f.get("type") == "status" and f.get("progress"))


async def test_an_http_server_that_goes_away_is_reconnected_when_it_is_back(tool_context: ToolContext) -> None:
    port = free_port()
    proc = await asyncio.to_thread(start_http, port)
    config = McpServerConfig(name="web", url=f"http://127.0.0.1:{port}/mcp", trusted=True)
    try:
        async with McpTools([config], restart_delay=0.2, restart_max=0.5) as mcp:
            echo = next(t for t in mcp.tools() if t.name == "web__echo").run
            assert echo is not None and await echo({"text": "one"}, tool_context) == "one"
            proc.kill()
            await asyncio.to_thread(proc.wait)
            with pytest.raises(ToolError):
                await echo({"text": "gone"}, tool_context)
            await eventually_async(lambda: mcp.status()["web"], accept=lambda status: status["state"] == "failed",
                                   timeout=15, what="the session to be failed")
            proc = await asyncio.to_thread(start_http, port)
            await eventually_async(lambda: mcp.status()["web"], accept=lambda status: status["state"] == "up",
                                   timeout=15, what="the session to be up again")
            echo = next(t for t in mcp.tools() if t.name == "web__echo").run
            assert echo is not None and await echo({"text": "two"}, tool_context) == "two"
    finally:
        proc.kill()
        proc.wait()


async def test_a_server_starts_only_when_the_worlds_tools_are_needed(harness: Harness) -> None:
    await harness.make_world("alice")
    await harness.engine.worlds.update(harness.world, OWNER, settings={"mcp_servers": [
        {"name": "t", "command": sys.executable, "args": [TROUBLE]}]})
    await eventually_async(lambda: "t" in harness.engine.world_tools.status(harness.world), timeout=10,
                           what="the change to reach the engine")
    await asyncio.sleep(0.3)
    assert harness.engine.world_tools.status(harness.world)["t"]["state"] == "stopped"  # nothing asked for it yet
    info = await harness.engine.get_world(harness.world)  # listing the world's tools needs it
    assert info["mcp_status"]["t"]["state"] == "up" and "t__echo" in {t["name"] for t in info["tools"]}


async def test_a_servers_secrets_printed_to_stderr_are_hidden_in_its_status(harness: Harness) -> None:
    secret = "sk-" + secrets.token_hex(20)
    leaky = "import os, sys; sys.stderr.write('my key is ' + os.environ['API_KEY'] + chr(10)); sys.exit(2)"
    await harness.make_world("alice", mcp_servers=[{"name": "leaky", "command": sys.executable, "args": ["-c", leaky],
                                                    "env": {"API_KEY": secret}}])
    status = await _wait_state(harness, "leaky", "failed")
    info = await harness.engine.get_world(harness.world)
    assert "my key is" in status["stderr_tail"] and "my key is" in info["tool_errors"]["leaky"]
    assert secret not in str(info["mcp_status"]) and secret not in str(info["tool_errors"])


async def test_closing_a_session_never_swallows_the_callers_cancel() -> None:
    """A task cancelled while it waits for a session to shut down is cancelled: close() stops the
    session and lets the cancel go on (it used to catch it and return as if nothing happened)."""
    from server.tools.mcp.server import McpConnection

    conn = McpConnection(_trouble())
    conn.task = asyncio.create_task(conn.serve())
    await conn.ready
    closing = asyncio.create_task(conn.close(timeout=30))
    await asyncio.sleep(0)  # close() now waits for the session task, which needs the server to answer
    assert not closing.done() and not conn.task.done()
    closing.cancel()
    await asyncio.wait([closing])
    assert closing.cancelled()
    await asyncio.wait([conn.task])  # the session was told to stop: it ends
    assert conn.task.done() and conn.errlog.closed
