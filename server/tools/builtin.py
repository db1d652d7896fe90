"""Tools every world has: a shell and file access confined to the agent's workspace, and a UI notice."""
from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import os
from functools import partial
from pathlib import Path
from typing import Any

from .base import Tool, ToolContext, ToolError
from .egress import proxy as egress
from .egress.hosts import network_mode
from .sandbox import bubblewrap as sandbox
from .sandbox import warm
from .sandbox.output import CappedOutput, pump, start_process, take_the_rest, wait_exit
from .workspace_fs import FILE_FLAGS, checked, components, display, open_parent, open_to_read, os_error, workspace_root

SHELL_DEFAULT_TIMEOUT = 30
SHELL_MAX_TIMEOUT = 120
SHELL_OUTPUT_LIMIT = 64 * 1024
# After the shell exits, how long a background child that kept the pipe open may keep writing
# before its process group is killed: the call must not hang on `sleep 100 &`.
SHELL_DRAIN_GRACE = 1.0
READ_DEFAULT_LIMIT = 256 * 1024
READ_MAX_LIMIT = 4 * 1024 * 1024
DIFF_MAX_BYTES = 128 * 1024  # each side of a file write's diff, and the diff: what a decider can read


# --- shell_exec ---------------------------------------------------------------------------------

def _shell_env(workspace: Path) -> dict[str, str]:
    # Built from scratch, never copied from os.environ: the server holds API keys and tokens.
    return {"PATH": os.environ.get("PATH") or os.defpath, "HOME": str(workspace),
            "LANG": "C.UTF-8", "TERM": "dumb"}


async def _shell_exec(args: dict[str, Any], ctx: ToolContext, *, network: str = "off",
                      caps: tuple[int, int] = (egress.DEFAULT_CONNECTION_BYTES, egress.DEFAULT_CALL_BYTES)) -> str:
    """`network`: the world's mode (off, open, ask); `caps`: bytes per connection and per call in `ask`."""
    if network == "ask":
        if refusal := sandbox.status().ask_refusal():
            raise ToolError(refusal)
        if ctx.network is None:
            raise ToolError("the world asks about each connection, but nothing here can ask: "
                            "this call cannot have a network")
        async with egress.CallProxy(ctx, "shell_exec", ctx.network, connection_bytes=caps[0],
                                    call_bytes=caps[1]) as proxy:
            return await _shell_run(args, ctx, proxy=proxy.folder)
    return await _shell_run(args, ctx, network=network == "open")


async def _shell_run(args: dict[str, Any], ctx: ToolContext, *, network: bool = False,
                     proxy: Path | None = None) -> str:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolError("command must be a non-empty string")
    timeout = args.get("timeout", SHELL_DEFAULT_TIMEOUT)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= SHELL_MAX_TIMEOUT:
        raise ToolError(f"timeout must be an integer from 1 to {SHELL_MAX_TIMEOUT} seconds")
    box = sandbox.status()
    if not box.tools_allowed:
        raise ToolError(box.refusal())
    if "\x00" in command:
        raise ToolError("command must not contain NUL characters")
    workspace = await workspace_root(ctx.workspace)
    env = _shell_env(workspace) | (egress.proxy_env() if proxy is not None else {})
    try:
        if box.sandboxed:  # a pre-started sandbox when one fits (warm.py): one command each
            proc = await warm.spawn(workspace, command, timeout=timeout, network=network, env=env, proxy=proxy)
        else:
            proc = await start_process(
                "/bin/sh", "-c", command, cwd=workspace, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise ToolError(f"could not start the shell: {exc}") from None
    assert proc.stdout is not None
    output = CappedOutput(SHELL_OUTPUT_LIMIT)
    reader = asyncio.create_task(pump(proc.stdout, output))
    loop = asyncio.get_running_loop()
    timed_out = False
    try:
        if not await wait_exit(proc, loop.time() + timeout):
            timed_out = True
            warm.kill_group(proc)  # in the sandbox, bwrap's death takes its whole PID namespace along
            await wait_exit(proc, loop.time() + SHELL_DRAIN_GRACE)
        if box.sandboxed:
            # The sandbox ended with its command (its first process kills whatever is left), and what
            # was written has come in; its output's end is not waited for: that first process holds
            # the pipe while the kernel takes its namespaces down (a p99 of 8 ms here, against 1.3
            # for the end itself).
            await take_the_rest(reader, proc.stdout, output)
        else:
            try:
                async with asyncio.timeout(SHELL_DRAIN_GRACE):  # not wait_for: it can swallow a cancel on 3.11
                    await asyncio.shield(reader)
            except TimeoutError:
                warm.kill_group(proc)  # a background child still holds the pipe
                with contextlib.suppress(TimeoutError):  # one that left the group: give up on it
                    async with asyncio.timeout(SHELL_DRAIN_GRACE):
                        await asyncio.shield(reader)
    finally:
        # Also on cancellation (the engine gave up on this call): leave no process behind.
        if proc.returncode is None or not (reader.done() or box.sandboxed):
            warm.kill_group(proc)
        if not reader.done():
            reader.cancel()
        # Exited, its output taken: whatever still holds the pipe (a sandbox's first process, a child that
        # left the group) is not watched on.
        if proc.returncode is not None:
            warm.forget(proc)
        if box.sandboxed and proxy is None:  # (a sandbox with a proxy is one call's: never warm)
            warm.refill(workspace, network=network, env=env)
    return json.dumps({"exit_code": proc.returncode, "output": output.text(),
                       "truncated": output.dropped > 0, "timed_out": timed_out})


# --- file_read / file_write ---------------------------------------------------------------------

async def _file_read(args: dict[str, Any], ctx: ToolContext) -> str:
    limit = args.get("max_bytes", READ_DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= READ_MAX_LIMIT:
        raise ToolError(f"max_bytes must be an integer from 1 to {READ_MAX_LIMIT}")
    root = await workspace_root(ctx.workspace)
    parts = components(root, ctx.workspace, args.get("path"))
    shown = display(parts)
    if not parts:
        raise ToolError(f"{shown} is a directory")

    def read() -> tuple[bytes, int]:
        try:
            fd = open_to_read(root, parts)
            with os.fdopen(fd, "rb") as f:
                size = checked(fd, shown).st_size
                return f.read(limit), size
        except OSError as exc:
            raise os_error(exc, shown, "read") from None

    data, size = await asyncio.to_thread(read)
    text = data.decode("utf-8", errors="replace")
    if size > len(data):
        text += f"\n[... truncated: showing {len(data)} of {size} bytes ...]"
    return text


async def _file_write(args: dict[str, Any], ctx: ToolContext) -> str:
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string")
    root = await workspace_root(ctx.workspace)
    parts = components(root, ctx.workspace, args.get("path"))
    shown = display(parts)
    if not parts:
        raise ToolError("path must name a file, not the workspace itself")
    data = content.encode("utf-8")

    def write() -> None:
        try:
            parent = open_parent(root, parts, create=True)
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | FILE_FLAGS, 0o666, dir_fd=parent)
            finally:
                os.close(parent)
            with os.fdopen(fd, "wb") as f:
                checked(fd, shown)  # before truncating or giving it away: a hard-linked file is left alone
                if (owner := sandbox.file_owner(root)) is not None:
                    os.fchown(fd, *owner)
                os.set_blocking(fd, True)
                f.truncate(0)
                f.write(data)
        except OSError as exc:
            raise os_error(exc, shown, "write") from None

    await asyncio.to_thread(write)
    return json.dumps({"path": shown, "bytes": len(data)})


async def _file_write_diff(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The approval request's `diff`: a unified diff from the file as it is now to `content` (a new file
    is all added), read as file_read reads, without following links. {path, new, text} or {path, error}."""
    root = await workspace_root(ctx.workspace)
    parts = components(root, ctx.workspace, args.get("path"))
    shown = display(parts)
    content = args.get("content")
    if not parts or not isinstance(content, str):
        raise ToolError("nothing to compare")

    def read() -> bytes | None:
        try:
            fd = open_to_read(root, parts)
            with os.fdopen(fd, "rb") as f:
                if checked(fd, shown).st_size > DIFF_MAX_BYTES:
                    raise ToolError(f"the current file is over {DIFF_MAX_BYTES} bytes: not compared, "
                                    "the write replaces it whole")
                return f.read()
        except FileNotFoundError:
            return None  # a new file (its folders may be new too)
        except OSError as exc:
            raise os_error(exc, shown, "read") from None

    if len(content) > DIFF_MAX_BYTES:
        raise ToolError(f"the new content is over {DIFF_MAX_BYTES} characters: not compared, shown as it is")

    def compare() -> dict[str, Any]:
        # In a thread: difflib's time grows with both sides' lengths, and the content is an LLM's.
        old = read()
        try:
            before = [] if old is None else old.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise ToolError("the current file is not UTF-8 text: not compared, the write replaces it whole") from None
        text = "\n".join(difflib.unified_diff(before, content.splitlines(),
                                              "/dev/null" if old is None else f"a/{shown}", f"b/{shown}",
                                              lineterm=""))
        if len(text) > DIFF_MAX_BYTES:  # it is stored with the request and sent to every screen
            raise ToolError(f"the diff is over {DIFF_MAX_BYTES} characters: not shown, the content is")
        return {"path": shown, "new": old is None, "text": text}

    return await asyncio.to_thread(compare)


# --- the catalogue ------------------------------------------------------------------------------

def shell_tool(*, network: bool | str = "off", caps: tuple[int, int] = (egress.DEFAULT_CONNECTION_BYTES,
                                                                         egress.DEFAULT_CALL_BYTES)) -> Tool:
    """`shell_exec`; `network`: its sandbox's network (the world's `sandbox_network`, or its mode: off, open, ask)."""
    network = network if isinstance(network, str) else network_mode(network)
    where = {"off": " without network", "open": "",
             "ask": (" whose only way out is an HTTP proxy (set in its environment): each new host:port waits "
                     "for a person's approval, and a refused one answers 403 with the reason")}[network]
    return Tool(
        name="shell_exec",
        description=("Run a shell command in your workspace directory, in a sandbox"
                     f"{where}. stdin is closed; stdout and "
                     f"stderr are combined and capped at {SHELL_OUTPUT_LIMIT // 1024} KiB. Returns JSON "
                     "{exit_code, output, truncated, timed_out}."),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1, "description": "The command, run by /bin/sh."},
                "timeout": {"type": "integer", "minimum": 1, "maximum": SHELL_MAX_TIMEOUT,
                            "description": f"Seconds before the command is killed (default {SHELL_DEFAULT_TIMEOUT})."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        requires_approval=True,
        run=partial(_shell_exec, network=network, caps=caps),
        for_settings=lambda settings: shell_tool(
            network=network_mode(settings.get("sandbox_network")),
            caps=(int(settings.get("network_connection_bytes") or egress.DEFAULT_CONNECTION_BYTES),
                  int(settings.get("network_call_bytes") or egress.DEFAULT_CALL_BYTES))),
    )


def builtin_tools() -> list[Tool]:
    """The built-in tools; without a working sandbox (and no --unsafe-no-sandbox) there is no shell."""
    shell = [shell_tool()] if sandbox.status().tools_allowed else []
    return [
        *shell,
        Tool(
            name="file_read",
            description="Read a text file in your workspace (path relative to the workspace).",
            parameters={
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": READ_MAX_LIMIT,
                                  "description": f"Read at most this many bytes (default {READ_DEFAULT_LIMIT})."},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
            requires_approval=False,
            idempotent=True,
            read_only=True,
            run=_file_read,
        ),
        Tool(
            name="file_write",
            description=("Write a text file in your workspace (path relative to the workspace), replacing "
                         "it if it exists and creating parent directories. Returns JSON {path, bytes}."),
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}},
                "required": ["path", "content"],
                "additionalProperties": False,
            },
            requires_approval=True,
            idempotent=True,  # writing the same content twice leaves the same file
            run=_file_write,
            diff=_file_write_diff,
        ),
        Tool(
            name="ui_notify",
            description="Show a short notification to the people watching this chat.",
            parameters={
                "type": "object",
                "properties": {
                    "message": {"type": "string", "minLength": 1},
                    "level": {"type": "string", "enum": ["info", "success", "warning", "error"]},
                },
                "required": ["message"],
                "additionalProperties": False,
            },
            location="client",
            requires_approval=False,
            run=None,  # the browser shows it
        ),
    ]
