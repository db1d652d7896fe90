"""The tools layer: registry and argument validation, built-in tools, redaction, and MCP tools."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from server.tools.base import Tool, ToolContext, ToolError
from server.tools.builtin import SHELL_OUTPUT_LIMIT, builtin_tools, shell_tool
from server.tools.mcp.tools import McpServerConfig, McpStartError, McpTools, sanitize_name
from server.tools.registry import ToolArgumentError, ToolRegistry, parse_arguments
from server.tools.sandbox import bubblewrap as sandbox
from server.tools.sandbox.output import CappedOutput, pump, start_process, take_the_rest, wait_exit
from tests.fixtures.tools import ECHO_SERVER

T = TypeVar("T")


def _tool(registry: ToolRegistry, name: str) -> Tool:
    tool = registry.get(name)
    assert tool is not None, name
    return tool


async def run(registry: ToolRegistry, name: str, args: dict[str, Any], ctx: ToolContext) -> str:
    tool = registry.get(name)
    assert tool is not None and tool.run is not None
    return await tool.run(args, ctx)


# --- registry and arguments ---------------------------------------------------------------------

def test_missing_required_argument_is_reported_with_its_location(tool_registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError) as err:
        parse_arguments(_tool(tool_registry, "shell_exec"), '{"timeout": 5}')
    assert str(err.value) == "'command' is a required property (at $)"


def test_argument_of_wrong_type_is_rejected(tool_registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError, match=r"is not of type 'integer' \(at \$\.timeout\)"):
        parse_arguments(_tool(tool_registry, "shell_exec"), '{"command": "ls", "timeout": "soon"}')
    with pytest.raises(ToolArgumentError, match=r"\(at \$\.timeout\)"):
        parse_arguments(_tool(tool_registry, "shell_exec"), '{"command": "ls", "timeout": 500}')


def test_arguments_that_are_not_json_are_rejected(tool_registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError, match=r"^arguments are not valid JSON: "):
        parse_arguments(_tool(tool_registry, "shell_exec"), '{"command": "ls"')


def test_arguments_that_are_not_an_object_are_rejected(tool_registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError, match=r"^arguments must be an object, got array$"):
        parse_arguments(_tool(tool_registry, "shell_exec"), '["ls"]')
    with pytest.raises(ToolArgumentError, match="got string"):
        parse_arguments(_tool(tool_registry, "shell_exec"), '"ls"')


def test_empty_arguments_count_as_an_empty_object() -> None:
    no_args = Tool(name="ping", description="", parameters={"type": "object", "properties": {}})
    assert parse_arguments(no_args, "") == {}
    assert parse_arguments(no_args, "  ") == {}


def test_empty_arguments_still_need_the_required_properties(tool_registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError, match="'command' is a required property"):
        parse_arguments(_tool(tool_registry, "shell_exec"), "")


def test_valid_arguments_are_returned_parsed(tool_registry: ToolRegistry) -> None:
    args = parse_arguments(_tool(tool_registry, "shell_exec"), '{"command": "ls -la", "timeout": 5}')
    assert args == {"command": "ls -la", "timeout": 5}


def test_several_schema_errors_are_listed_without_dumping_huge_values() -> None:
    tool = Tool(name="four", description="", parameters={
        "type": "object", "properties": {k: {"type": "integer"} for k in "abcd"}, "required": list("abcd")})
    raw = json.dumps({"a": "x" * 10_000, "b": "y", "c": "z", "d": "w"})
    with pytest.raises(ToolArgumentError) as err:
        parse_arguments(tool, raw)
    message = str(err.value)
    assert "(at $.a)" in message and message.endswith("; and 1 more")
    assert len(message) < 1000


def test_registry_rejects_invalid_names_duplicates_and_broken_schemas(tool_registry: ToolRegistry) -> None:
    for bad in ("client.requestApproval", "has space", "", "x" * 65):
        with pytest.raises(ValueError, match="invalid tool name"):
            tool_registry.register(Tool(name=bad, description="", parameters={"type": "object"}))
    with pytest.raises(ValueError, match="already registered"):
        tool_registry.register(builtin_tools()[0])
    with pytest.raises(ValueError, match="invalid parameter schema"):
        tool_registry.register(Tool(name="broken", description="", parameters={"type": "no-such-type"}))
    assert "broken" not in tool_registry


def test_specs_are_sorted_by_name_and_filtered(tool_registry: ToolRegistry) -> None:
    names = [spec["function"]["name"] for spec in tool_registry.specs()]
    assert names == ["file_read", "file_write", "shell_exec", "ui_notify"]
    only = tool_registry.specs(["shell_exec", "file_read", "gone__tool"])
    assert [spec["function"]["name"] for spec in only] == ["file_read", "shell_exec"]
    assert only[1] == {"type": "function", "function": {
        "name": "shell_exec", "description": _tool(tool_registry, "shell_exec").description,
        "parameters": _tool(tool_registry, "shell_exec").parameters}}


def test_unregister_prefix_removes_only_that_server(tool_registry: ToolRegistry) -> None:
    for name in ("gh__issues", "gh__pulls", "ghx__other"):
        tool_registry.register(Tool(name=name, description="", parameters={"type": "object"}))
    assert tool_registry.unregister_prefix("gh__") == ["gh__issues", "gh__pulls"]
    assert tool_registry.get("gh__issues") is None and tool_registry.get("ghx__other") is not None


def test_builtin_approval_policies(tool_registry: ToolRegistry) -> None:
    shell, read, write, notify = (_tool(tool_registry, n)
                                  for n in ("shell_exec", "file_read", "file_write", "ui_notify"))
    assert shell.requires_approval and write.requires_approval
    assert not read.requires_approval and read.read_only and read.idempotent
    assert notify.location == "client" and notify.run is None and not notify.requires_approval


# --- shell_exec ---------------------------------------------------------------------------------

async def test_shell_runs_in_the_workspace(tool_registry: ToolRegistry, tool_context: ToolContext) -> None:
    out = json.loads(await run(tool_registry, "shell_exec", {"command": "pwd; echo hi > made.txt; exit 3"},
                               tool_context))
    assert out["output"].strip() == str(tool_context.workspace.resolve())
    assert out["exit_code"] == 3 and not out["timed_out"] and not out["truncated"]
    assert (tool_context.workspace / "made.txt").read_text() == "hi\n"


async def test_shell_creates_a_missing_workspace(tool_registry: ToolRegistry, tmp_path: Path) -> None:
    ctx = ToolContext(world="w", agent="a", chat="c", workspace=tmp_path / "new" / "ws")
    out = json.loads(await run(tool_registry, "shell_exec", {"command": "echo ok"}, ctx))
    assert out["output"] == "ok\n" and ctx.workspace.is_dir()


async def test_shell_prepares_a_workspace_that_was_removed_or_replaced_again(tool_registry: ToolRegistry,
                                                                          tmp_path: Path) -> None:
    # A workspace seen before is only checked (same directory, same owner); any other is prepared again.
    ctx = ToolContext(world="w", agent="a", chat="c", workspace=tmp_path / "ws")
    for step in ("first", "again"):
        out = json.loads(await run(tool_registry, "shell_exec", {"command": f"echo {step} > {step}.txt"}, ctx))
        assert out["exit_code"] == 0 and (ctx.workspace / f"{step}.txt").read_text() == f"{step}\n", out
    shutil.rmtree(ctx.workspace)  # removed: made again
    out = json.loads(await run(tool_registry, "shell_exec", {"command": "echo made > made.txt"}, ctx))
    assert out["exit_code"] == 0 and (ctx.workspace / "made.txt").read_text() == "made\n", out
    shutil.rmtree(ctx.workspace)
    ctx.workspace.mkdir()  # replaced by a new directory (the server's, not yet the sandbox user's)
    out = json.loads(await run(tool_registry, "shell_exec", {"command": "echo new > new.txt"}, ctx))
    assert out["exit_code"] == 0 and (ctx.workspace / "new.txt").read_text() == "new\n", out


async def test_shell_output_is_capped_with_a_marker(tool_registry: ToolRegistry, tool_context: ToolContext) -> None:
    out = json.loads(await run(tool_registry, "shell_exec",
                               {"command": "echo START; yes line | head -c 300000; echo; echo END"}, tool_context))
    assert out["truncated"] and out["exit_code"] == 0
    assert out["output"].startswith("START\n") and out["output"].endswith("END\n")
    assert "output truncated" in out["output"]
    assert len(out["output"].encode()) < SHELL_OUTPUT_LIMIT + 200


async def test_shell_merges_stderr_and_closes_stdin(tool_registry: ToolRegistry, tool_context: ToolContext) -> None:
    out = json.loads(await run(tool_registry, "shell_exec", {"command": "echo oops >&2; cat; echo done"},
                               tool_context))
    assert out["output"] == "oops\ndone\n"  # `cat` saw EOF at once instead of waiting


async def test_shell_times_out_and_kills_the_process_group(tool_registry: ToolRegistry,
                                                           tool_context: ToolContext) -> None:
    # The background child would leave a mark if it outlived the kill (its pid is the sandbox's, not ours).
    # timed_out says the 1 s timeout ended it, not the 30 s sleep.
    out = json.loads(await run(tool_registry, "shell_exec",
                               {"command": "(sleep 1.5; echo late > late.txt) & echo started; sleep 30", "timeout": 1},
                               tool_context))
    assert out["timed_out"] and out["output"] == "started\n" and out["exit_code"] != 0
    await asyncio.sleep(2)
    assert not (tool_context.workspace / "late.txt").exists()


async def test_shell_does_not_wait_for_background_children(tool_registry: ToolRegistry,
                                                           tool_context: ToolContext) -> None:
    # Had it waited for the child (which holds the output pipe), "late" would be in the output.
    out = json.loads(await run(tool_registry, "shell_exec", {"command": "(sleep 3; echo late) & echo bye"},
                               tool_context))
    assert out == {"exit_code": 0, "output": "bye\n", "truncated": False, "timed_out": False}


async def test_shell_does_not_leak_server_secrets(tool_registry: ToolRegistry, tool_context: ToolContext,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    monkeypatch.setenv("AGENT_WORLD_TOKEN", "tok-very-secret")
    out = json.loads(await run(tool_registry, "shell_exec", {"command": "env"}, tool_context))
    assert "very-secret" not in out["output"]
    assert f"HOME={tool_context.workspace.resolve()}" in out["output"]
    assert "PATH=" in out["output"]


async def test_an_unsandboxed_command_whose_child_left_its_group_leaves_no_pipe_behind(
        tool_registry: ToolRegistry, tool_context: ToolContext) -> None:
    # --unsafe-no-sandbox: the group is killed after the grace, but `setsid` took the child out of it and
    # it holds the output pipe; the call gives up on it, and must stop watching that pipe too.
    sandbox.configure(unsafe=True)
    try:
        fds = len(os.listdir("/proc/self/fd"))
        out = json.loads(await run(tool_registry, "shell_exec", {"command": "setsid sleep 30 & echo $!"},
                                   tool_context))
        await asyncio.sleep(0.1)  # a closed transport closes its pipe a loop turn later
        left = len(os.listdir("/proc/self/fd"))
        os.kill(int(out["output"]), signal.SIGKILL)
    finally:
        sandbox.configure()
    assert out["exit_code"] == 0 and left == fds


async def test_unsandboxed_a_world_that_asks_about_connections_runs_no_command(tool_context: ToolContext) -> None:
    # --unsafe-no-sandbox: nothing holds an unsandboxed command's connections at the proxy, so `ask` would
    # be a promise nothing keeps (the command would reach any host unasked): the shell refuses, and the
    # world's tool_errors says why. A world without the network still runs commands (the owner's choice).
    sandbox.configure(unsafe=True)
    try:
        assert "--unsafe-no-sandbox" in sandbox.tool_errors(network="ask")["shell_exec"]
        assert sandbox.tool_errors(network="off") == {}
        asking = shell_tool(network="ask")
        assert asking.run is not None
        with pytest.raises(ToolError, match="only the tool sandbox can hold"):
            await asking.run({"command": "touch ran"}, tool_context)
        assert not (tool_context.workspace / "ran").exists()
    finally:
        sandbox.configure()


# --- file_read / file_write ---------------------------------------------------------------------

async def test_file_write_then_read_round_trips(tool_registry: ToolRegistry, tool_context: ToolContext) -> None:
    written = json.loads(await run(tool_registry, "file_write", {"path": "a/b/notes.txt", "content": "héllo\n"},
                                   tool_context))
    assert written == {"path": "a/b/notes.txt", "bytes": 7}
    assert await run(tool_registry, "file_read", {"path": "a/b/notes.txt"}, tool_context) == "héllo\n"
    inside = str(tool_context.workspace / "a" / "b" / "notes.txt")
    assert await run(tool_registry, "file_read", {"path": inside}, tool_context) == "héllo\n"


@pytest.mark.parametrize("path", ["../outside.txt", "a/../../outside.txt", "/etc/passwd"])
async def test_file_tools_refuse_paths_outside_the_workspace(tool_registry: ToolRegistry,
                                                             tool_context: ToolContext, path: str) -> None:
    (tool_context.workspace.parent / "outside.txt").write_text("secret")
    with pytest.raises(ToolError, match="outside the workspace"):
        await run(tool_registry, "file_read", {"path": path}, tool_context)
    with pytest.raises(ToolError, match="outside the workspace"):
        await run(tool_registry, "file_write", {"path": path, "content": "x"}, tool_context)
    assert (tool_context.workspace.parent / "outside.txt").read_text() == "secret"


async def test_file_tools_refuse_a_symlink_leaving_the_workspace(tool_registry: ToolRegistry,
                                                                 tool_context: ToolContext) -> None:
    outside = tool_context.workspace.parent / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (tool_context.workspace / "link").symlink_to(outside)
    (tool_context.workspace / "dangling").symlink_to(outside / "new.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        await run(tool_registry, "file_read", {"path": "link/secret.txt"}, tool_context)
    with pytest.raises(ToolError, match="outside the workspace"):
        await run(tool_registry, "file_write", {"path": "dangling", "content": "x"}, tool_context)
    assert not (outside / "new.txt").exists()


async def test_file_read_follows_no_symlink_even_one_that_stays_inside(tool_registry: ToolRegistry,
                                                                       tool_context: ToolContext) -> None:
    # A link is checked and then followed by the kernel: a command could swap its target in between.
    (tool_context.workspace / "real.txt").write_text("data")
    (tool_context.workspace / "alias.txt").symlink_to(tool_context.workspace / "real.txt")
    with pytest.raises(ToolError, match="symbolic links are not followed"):
        await run(tool_registry, "file_read", {"path": "alias.txt"}, tool_context)


async def test_file_read_caps_size_and_reports_missing_files(tool_registry: ToolRegistry,
                                                             tool_context: ToolContext) -> None:
    (tool_context.workspace / "big.bin").write_bytes(b"a" * 100 + b"\xff" + b"b" * 100)
    text = await run(tool_registry, "file_read", {"path": "big.bin", "max_bytes": 101}, tool_context)
    assert text.startswith("a" * 100 + "\ufffd") and "showing 101 of 201 bytes" in text
    with pytest.raises(ToolError, match=r"^no such file: missing\.txt$"):
        await run(tool_registry, "file_read", {"path": "missing.txt"}, tool_context)
    with pytest.raises(ToolError, match="is a directory"):
        await run(tool_registry, "file_read", {"path": "."}, tool_context)


# --- MCP ----------------------------------------------------------------------------------------

def echo_config(name: str = "echo") -> McpServerConfig:
    return McpServerConfig(name=name, command=sys.executable, args=[ECHO_SERVER],
                           env={"ECHO_MARKER": "1"})


async def test_mcp_tools_are_named_by_server_and_ask_when_untrusted(tmp_path: Path,
                                                                            tool_context: ToolContext) -> None:
    async with McpTools([echo_config()], workspace=tmp_path) as mcp:  # its sandbox may write there only
        tools = {tool.name: tool for tool in mcp.tools()}
        assert set(tools) == {"echo__echo", "echo__count", "echo__append", "echo__fail", "echo__getenv",
                              "echo__getenv_sha256", "echo__niceness"}
        echo, count, fail, getenv = (tools[f"echo__{n}"] for n in ("echo", "count", "fail", "getenv"))
        assert echo.run and count.run and fail.run and getenv.run  # server tools
        assert echo.requires_approval and not echo.read_only and not echo.idempotent  # untrusted: hints don't count
        assert count.requires_approval and not count.read_only and not count.idempotent
        assert count.parameters["required"] == ["path"] and count.parameters["type"] == "object"

        registry = ToolRegistry()
        for tool in mcp.tools():
            registry.register(tool)
        args = parse_arguments(echo, '{"text": "hello"}')
        assert await echo.run(args, tool_context) == "hello"
        counter = tmp_path / "count.txt"
        assert await count.run({"path": str(counter)}, tool_context) == "1"
        assert await count.run({"path": str(counter)}, tool_context) == "2"
        assert counter.read_text() == "x\nx\n"
        with pytest.raises(ToolError, match="fail"):
            await fail.run({"message": "boom"}, tool_context)
        # The config's env reaches the server; the server's own secrets do not.
        assert await getenv.run({"name": "ECHO_MARKER"}, tool_context) == "1"
        assert await getenv.run({"name": "OPENAI_API_KEY"}, tool_context) == ""
        assert mcp.alive("echo")
    assert not mcp.alive("echo")
    with pytest.raises(ToolError, match="not running"):
        await echo.run({"text": "late"}, tool_context)


async def test_mcp_server_that_cannot_start_gives_a_clear_error() -> None:
    mcp = McpTools(start_timeout=5)
    try:
        with pytest.raises(McpStartError, match=r"'ghost' \(/no/such/mcp-server --flag\) failed to start"):
            await mcp.add(McpServerConfig(name="ghost", command="/no/such/mcp-server", args=["--flag"]))
        crash = McpServerConfig(name="crash", command=sys.executable,
                                args=["-c", "import sys; sys.exit('no config file')"])
        with pytest.raises(McpStartError, match=r"(?s)'crash'.*no config file"):
            await mcp.add(crash)
        assert mcp.tools() == []
    finally:
        await mcp.close()


async def test_a_failed_mcp_server_does_not_stop_the_others(tool_context: ToolContext) -> None:
    bad = McpServerConfig(name="bad", command="/no/such/mcp-server")
    async with McpTools([bad, echo_config("good")]) as mcp:
        assert isinstance(mcp.errors["bad"], McpStartError)
        assert {tool.name for tool in mcp.tools()} == {"good__echo", "good__count", "good__append", "good__fail",
                                                       "good__getenv", "good__getenv_sha256", "good__niceness"}
        echo = next(tool for tool in mcp.tools() if tool.name == "good__echo")
        assert echo.run is not None  # a server tool
        assert await echo.run({"text": "still here"}, tool_context) == "still here"


def test_mcp_tool_names_are_sanitized() -> None:
    assert sanitize_name("read.file/v2") == "read_file_v2"
    assert len(sanitize_name("x" * 100, 10)) == 10


async def test_the_output_taken_at_a_sandboxs_end_is_all_that_was_written_and_waits_for_no_more() -> None:
    # At a sandbox's end its output pipe may stay open a few ms: what came in is taken, however far
    # the reading task got with it, and nothing more is waited for.
    stream, sink = asyncio.StreamReader(), CappedOutput(1000)
    reader = asyncio.create_task(pump(stream, sink))
    stream.feed_data(b"one ")
    await asyncio.sleep(0)
    stream.feed_data(b"two ")  # in the stream; the reader's step that takes it is still to come
    stream.feed_data(b"three")
    async with asyncio.timeout(1):
        await take_the_rest(reader, stream, sink)
    assert sink.text() == "one two three" and reader.cancelled()


# --- a process's end: awaited by events, never by a timer ------------------------------------------

class _StoppedClock(asyncio.SelectorEventLoop):
    """An event loop whose clock stands still: no timer ever fires, so what it awaits must come by events."""

    def time(self) -> float:
        return 0.0


def _with_the_clock_stopped(make: Callable[[], Awaitable[T]], bound: float = 10.0) -> T | None:
    """What `make()` returns on a `_StoppedClock` loop, or None if it has not returned after `bound` real seconds."""
    done: list[T] = []

    def main() -> None:
        loop = _StoppedClock()
        try:
            done.append(loop.run_until_complete(make()))
        finally:
            loop.close()
    thread = threading.Thread(target=main, daemon=True)  # a daemon: a hang fails the test, not the run
    thread.start()
    thread.join(bound)
    return done[0] if done else None


def test_a_process_end_is_seen_by_its_exit_status_while_a_child_holds_its_output() -> None:
    # As a sandbox's first process holds the pipe while the kernel takes its namespaces down. A 2 ms
    # timer once the exit was seen, waiting for the status, held every approved command 2 ms on a loaded
    # machine (bench/e2e.py); on this stopped clock it never fires.
    async def run_it() -> tuple[bool, int | None]:
        proc = await start_process("/bin/sh", "-c", "sleep 30 & exit 4", stdout=asyncio.subprocess.PIPE,
                                   stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        exited = await wait_exit(proc, asyncio.get_running_loop().time() + 30)
        os.killpg(proc.pid, signal.SIGKILL)  # the sleeping child: leave nothing behind
        await proc.communicate()  # and its pipe closed
        return exited, proc.returncode
    assert _with_the_clock_stopped(run_it) == (True, 4)


def test_a_process_still_running_at_the_deadline_is_reported_so() -> None:
    async def run_it() -> tuple[bool, int | None]:
        proc = await start_process("/bin/sleep", "5", stdin=asyncio.subprocess.DEVNULL)
        exited = await wait_exit(proc, asyncio.get_running_loop().time() + 0.05)
        proc.kill()
        await proc.wait()
        return exited, proc.returncode
    assert asyncio.run(run_it()) == (False, -9)
