"""Tools every world has: a shell and file access confined to the agent's workspace, and a UI notice."""
from __future__ import annotations

import asyncio
import contextlib
import difflib
import errno
import json
import os
import stat
from functools import partial
from pathlib import Path
from typing import Any

from .base import Tool, ToolContext, ToolError
from .sandbox import bubblewrap as sandbox
from .sandbox import warm
from .sandbox.output import CappedOutput, pump, start_process, take_the_rest, wait_exit

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


async def _shell_exec(args: dict[str, Any], ctx: ToolContext, *, network: bool = False) -> str:
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
    workspace = await _workspace_root(ctx)
    try:
        if box.sandboxed:  # a pre-started sandbox when one fits (warm.py): one command each
            proc = await warm.spawn(workspace, command, timeout=timeout, network=network,
                                    env=_shell_env(workspace))
        else:
            proc = await start_process(
                "/bin/sh", "-c", command, cwd=workspace, env=_shell_env(workspace),
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
        if box.sandboxed:
            warm.refill(workspace, network=network, env=_shell_env(workspace))
    return json.dumps({"exit_code": proc.returncode, "output": output.text(),
                       "truncated": output.dropped > 0, "timed_out": timed_out})


# --- file_read / file_write ---------------------------------------------------------------------

# Workspaces prepared before: path -> ((device, inode), the resolved path). See _workspace_root.
_prepared: dict[Path, tuple[tuple[int, int], Path]] = {}


async def _workspace_root(ctx: ToolContext) -> Path:
    """The workspace, created and given to the sandbox user if need be; its resolved path."""
    # The same directory as last time, still the sandbox user's: one stat (as warm.py's) and no
    # thread, whose wake-up cost 0.2 ms at the median and 1-5 ms under load, on an approval's path.
    known = _prepared.get(ctx.workspace)
    if known is not None:
        try:
            info = os.stat(ctx.workspace)
        except OSError:
            info = None
        owner = sandbox.file_owner(ctx.workspace)
        if info is not None and (info.st_dev, info.st_ino) == known[0] and stat.S_ISDIR(info.st_mode) and (
                owner is None or info.st_uid == owner[0]):
            return known[1]

    def make() -> Path:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        sandbox.prepare_workspace(ctx.workspace)
        root = ctx.workspace.resolve()
        info = os.stat(root)
        _prepared[ctx.workspace] = ((info.st_dev, info.st_ino), root)
        return root
    return await asyncio.to_thread(make)


def _components(root: Path, ctx: ToolContext, raw: Any) -> tuple[str, ...]:
    """The path components of `raw` (relative to the workspace, or absolute) below the workspace.

    Lexical only: `..` may not climb out, and the components are then opened one by one without
    following any symbolic link, so no link (planted by a shell command, say) leads anywhere.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in raw:
        raise ToolError("path must not contain NUL characters")
    normalized = Path(os.path.normpath(raw))
    if normalized.is_absolute():
        for base in (root, ctx.workspace.absolute()):
            if normalized.is_relative_to(base):
                return normalized.relative_to(base).parts
        raise ToolError(f"path {raw!r} is outside the workspace")
    if normalized.parts[:1] == ("..",):
        raise ToolError(f"path {raw!r} is outside the workspace")
    return () if normalized == Path(".") else normalized.parts


def _display(parts: tuple[str, ...]) -> str:
    # Paths shown to the model are workspace-relative: the server's layout is none of its business.
    return "/".join(parts) or "."


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # non-blocking: opening a FIFO must not hang


def _open_parent(root: Path, parts: tuple[str, ...], *, create: bool) -> int:
    """A descriptor of the directory holding the last of `parts`, walked to without following links."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                    _give_to_sandbox(root, part, fd)
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_to_read(root: Path, parts: tuple[str, ...]) -> int:
    """A read-only descriptor of the file `parts` name, walked to without following links."""
    parent = _open_parent(root, parts, create=False)
    try:
        return os.open(parts[-1], os.O_RDONLY | _FILE_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)


def _give_to_sandbox(workspace: Path, name: str, dir_fd: int) -> None:
    owner = sandbox.file_owner(workspace)
    if owner is not None:
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


def _checked(fd: int, shown: str) -> os.stat_result:
    """The file's status, if it is a regular file with no other name (a hard link could be the database)."""
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{shown} is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{shown} is not a regular file")
    if info.st_nlink > 1:
        raise ToolError(f"{shown} has other hard links: refused, a hard link can point outside the workspace")
    return info


def _os_error(exc: OSError, shown: str, verb: str) -> ToolError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return ToolError(f"{shown}: symbolic links are not followed (they could lead outside the workspace), "
                         "and every part of the path must be a folder")
    if exc.errno == errno.ENOENT:
        return ToolError(f"no such file: {shown}")
    if exc.errno == errno.EISDIR:
        return ToolError(f"{shown} is a directory")
    return ToolError(f"cannot {verb} {shown}: {exc.strerror}")


async def _file_read(args: dict[str, Any], ctx: ToolContext) -> str:
    limit = args.get("max_bytes", READ_DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= READ_MAX_LIMIT:
        raise ToolError(f"max_bytes must be an integer from 1 to {READ_MAX_LIMIT}")
    root = await _workspace_root(ctx)
    parts = _components(root, ctx, args.get("path"))
    shown = _display(parts)
    if not parts:
        raise ToolError(f"{shown} is a directory")

    def read() -> tuple[bytes, int]:
        try:
            fd = _open_to_read(root, parts)
            with os.fdopen(fd, "rb") as f:
                size = _checked(fd, shown).st_size
                return f.read(limit), size
        except OSError as exc:
            raise _os_error(exc, shown, "read") from None

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
    parts = _components(root, ctx, args.get("path"))
    shown = _display(parts)
    if not parts:
        raise ToolError("path must name a file, not the workspace itself")
    data = content.encode("utf-8")

    def write() -> None:
        try:
            parent = _open_parent(root, parts, create=True)
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | _FILE_FLAGS, 0o666, dir_fd=parent)
            finally:
                os.close(parent)
            with os.fdopen(fd, "wb") as f:
                _checked(fd, shown)  # before truncating or giving it away: a hard-linked file is left alone
                if (owner := sandbox.file_owner(root)) is not None:
                    os.fchown(fd, *owner)
                os.set_blocking(fd, True)
                f.truncate(0)
                f.write(data)
        except OSError as exc:
            raise _os_error(exc, shown, "write") from None

    await asyncio.to_thread(write)
    return json.dumps({"path": shown, "bytes": len(data)})


async def _file_write_diff(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The approval request's `diff`: a unified diff from the file as it is now to `content` (a new file
    is all added), read as file_read reads, without following links. {path, new, text} or {path, error}."""
    root = await _workspace_root(ctx)
    parts = _components(root, ctx, args.get("path"))
    shown = _display(parts)
    content = args.get("content")
    if not parts or not isinstance(content, str):
        raise ToolError("nothing to compare")

    def read() -> bytes | None:
        try:
            fd = _open_to_read(root, parts)
            with os.fdopen(fd, "rb") as f:
                if _checked(fd, shown).st_size > DIFF_MAX_BYTES:
                    raise ToolError(f"the current file is over {DIFF_MAX_BYTES} bytes: not compared, "
                                    "the write replaces it whole")
                return f.read()
        except FileNotFoundError:
            return None  # a new file (its folders may be new too)
        except OSError as exc:
            raise _os_error(exc, shown, "read") from None

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

def shell_tool(*, network: bool = False) -> Tool:
    """`shell_exec`; `network`: whether its sandbox keeps the network (the world's `sandbox_network`)."""
    return Tool(
        name="shell_exec",
        description=("Run a shell command in your workspace directory, in a sandbox"
                     f"{'' if network else ' without network'}. stdin is closed; stdout and "
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
        run=partial(_shell_exec, network=network),
        for_settings=lambda settings: shell_tool(network=bool(settings.get("sandbox_network"))),
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
