"""Tools every world has: a shell and file access confined to the agent's workspace, and a UI notice."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

from .base import Tool, ToolContext, ToolError

SHELL_DEFAULT_TIMEOUT = 30
SHELL_MAX_TIMEOUT = 120
SHELL_OUTPUT_LIMIT = 64 * 1024
# After the shell exits, how long a background child that kept the pipe open may keep writing
# before its process group is killed: the call must not hang on `sleep 100 &`.
SHELL_DRAIN_GRACE = 1.0
READ_DEFAULT_LIMIT = 256 * 1024
READ_MAX_LIMIT = 4 * 1024 * 1024
_CHUNK = 16 * 1024


# --- shell_exec ---------------------------------------------------------------------------------

class _CappedOutput:
    """Keeps the head and the tail of a stream (errors are usually at the end), drops the middle."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit * 3 // 4
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]
                self.dropped += excess

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        marker = f"\n[... output truncated: {self.dropped} bytes omitted ...]\n"
        return (self.head.decode("utf-8", errors="replace") + marker
                + self.tail.decode("utf-8", errors="replace"))


def _shell_env(workspace: Path) -> dict[str, str]:
    # Built from scratch, never copied from os.environ: the server holds API keys and tokens.
    return {"PATH": os.environ.get("PATH") or os.defpath, "HOME": str(workspace),
            "LANG": "C.UTF-8", "TERM": "dumb"}


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The shell runs in its own session, so its pid is the group id of everything it started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _pump(stream: asyncio.StreamReader, sink: _CappedOutput) -> None:
    while chunk := await stream.read(_CHUNK):
        sink.feed(chunk)  # keep reading past the cap so the child never blocks on a full pipe


async def _wait_exit(proc: asyncio.subprocess.Process, pump: asyncio.Task[None], deadline: float) -> bool:
    """True once the shell has exited, False at the deadline."""
    # Polls returncode rather than awaiting proc.wait(): on Python 3.11 that also waits for the
    # pipes to close, which a background child (`server &`) can keep open for as long as it likes.
    loop = asyncio.get_running_loop()
    while proc.returncode is None:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        if pump.done():
            await asyncio.sleep(min(0.02, remaining))
        else:
            await asyncio.wait({pump}, timeout=min(0.05, remaining))
    return True


async def _shell_exec(args: dict[str, Any], ctx: ToolContext) -> str:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolError("command must be a non-empty string")
    timeout = args.get("timeout", SHELL_DEFAULT_TIMEOUT)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= SHELL_MAX_TIMEOUT:
        raise ToolError(f"timeout must be an integer from 1 to {SHELL_MAX_TIMEOUT} seconds")
    workspace = await _workspace_root(ctx)
    try:
        proc = await asyncio.create_subprocess_shell(
            command, cwd=workspace, env=_shell_env(workspace), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise ToolError(f"could not start the shell: {exc}") from None
    assert proc.stdout is not None
    output = _CappedOutput(SHELL_OUTPUT_LIMIT)
    pump = asyncio.create_task(_pump(proc.stdout, output))
    loop = asyncio.get_running_loop()
    timed_out = False
    try:
        if not await _wait_exit(proc, pump, loop.time() + timeout):
            timed_out = True
            _kill_group(proc)
            await _wait_exit(proc, pump, loop.time() + SHELL_DRAIN_GRACE)
        try:
            async with asyncio.timeout(SHELL_DRAIN_GRACE):  # not wait_for: it can swallow a cancel on 3.11
                await asyncio.shield(pump)
        except TimeoutError:
            _kill_group(proc)  # a background child still holds the pipe
            with contextlib.suppress(TimeoutError):  # one that left the group: give up on it
                async with asyncio.timeout(SHELL_DRAIN_GRACE):  # not wait_for: it can swallow a cancel on 3.11
                    await asyncio.shield(pump)
    finally:
        # Also on cancellation (the engine gave up on this call): leave no process behind.
        if proc.returncode is None or not pump.done():
            _kill_group(proc)
        if not pump.done():
            pump.cancel()
    return json.dumps({"exit_code": proc.returncode, "output": output.text(),
                       "truncated": output.dropped > 0, "timed_out": timed_out})


# --- file_read / file_write ---------------------------------------------------------------------

async def _workspace_root(ctx: ToolContext) -> Path:
    def make() -> Path:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        return ctx.workspace.resolve()
    return await asyncio.to_thread(make)


def _confine(root: Path, raw: Any) -> Path:
    """The real path of `raw` (relative to the workspace, or absolute) if it stays inside `root`."""
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in raw:
        raise ToolError("path must not contain NUL characters")
    given = Path(raw)
    # resolve() follows every symlink, dangling ones included, so a link pointing outside is
    # caught here as well as `..` and absolute paths. (An approved shell could still race a
    # symlink in after this check; it could read the file directly anyway.)
    resolved = (given if given.is_absolute() else root / given).resolve()
    if not resolved.is_relative_to(root):
        raise ToolError(f"path {raw!r} is outside the workspace")
    return resolved


def _display(root: Path, path: Path) -> str:
    # Paths shown to the model are workspace-relative: the server's layout is none of its business.
    return path.relative_to(root).as_posix() or "."


async def _file_read(args: dict[str, Any], ctx: ToolContext) -> str:
    limit = args.get("max_bytes", READ_DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= READ_MAX_LIMIT:
        raise ToolError(f"max_bytes must be an integer from 1 to {READ_MAX_LIMIT}")
    root = await _workspace_root(ctx)
    path = _confine(root, args.get("path"))
    shown = _display(root, path)

    def read() -> tuple[bytes, int]:
        try:
            # Checked before opening: opening a FIFO would block this thread for good.
            mode = path.stat().st_mode
            if stat.S_ISDIR(mode):
                raise ToolError(f"{shown} is a directory")
            if not stat.S_ISREG(mode):
                raise ToolError(f"{shown} is not a regular file")
            with path.open("rb") as f:
                data = f.read(limit)
                return data, os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            raise ToolError(f"no such file: {shown}") from None
        except OSError as exc:
            raise ToolError(f"cannot read {shown}: {exc.strerror}") from None

    data, size = await asyncio.to_thread(read)
    text = data.decode("utf-8", errors="replace")
    if size > len(data):
        text += f"\n[... truncated: showing {len(data)} of {size} bytes ...]"
    return text


async def _file_write(args: dict[str, Any], ctx: ToolContext) -> str:
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string")
    root = await _workspace_root(ctx)
    path = _confine(root, args.get("path"))
    shown = _display(root, path)
    if path == root:
        raise ToolError("path must name a file, not the workspace itself")
    data = content.encode("utf-8")

    def write() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except IsADirectoryError:
            raise ToolError(f"{shown} is a directory") from None
        except OSError as exc:
            raise ToolError(f"cannot write {shown}: {exc.strerror}") from None

    await asyncio.to_thread(write)
    return json.dumps({"path": shown, "bytes": len(data)})


# --- the catalogue ------------------------------------------------------------------------------

def builtin_tools() -> list[Tool]:
    return [
        Tool(
            name="shell_exec",
            description=("Run a shell command in your workspace directory. stdin is closed; stdout and "
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
            run=_shell_exec,
        ),
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
