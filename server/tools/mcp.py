"""Tools from MCP servers run over stdio, exposed to the LLM as `<server>__<tool>`."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types

from ..vocab import LLM_NAME
from .base import Runner, Tool, ToolContext, ToolError

log = logging.getLogger(__name__)

SEPARATOR = "__"
_NAME_LIMIT = 64
_STDERR_TAIL = 2000  # characters of a failed server's stderr quoted in McpStartError


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def command_line(self) -> str:
        return shlex.join([self.command, *self.args])


class McpStartError(Exception):
    """An MCP server could not be started or did not complete its handshake."""

    def __init__(self, config: McpServerConfig, reason: str) -> None:
        super().__init__(f"MCP server {config.name!r} ({config.command_line()}) failed to start: {reason}")
        self.server = config.name
        self.command = config.command_line()


def sanitize_name(name: str, limit: int = _NAME_LIMIT) -> str:
    """`name` made acceptable to the LLM: invalid characters become `_`, cut to `limit`."""
    cleaned = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:limit]
    return cleaned or "_"


def tool_from_mcp(server: str, listed: mcp_types.Tool, name: str, run: Runner) -> Tool:
    """A Tool for one listed MCP tool; its annotations are hints from a server we don't control."""
    hints = listed.annotations
    read_only = bool(hints and hints.read_only_hint is True)
    idempotent = bool(hints and (hints.idempotent_hint is True or read_only))
    schema = listed.input_schema if isinstance(listed.input_schema, dict) else {}
    parameters = dict(schema) or {"type": "object", "properties": {}}
    parameters.setdefault("type", "object")
    description = listed.description or (hints.title if hints and hints.title else "") or listed.name
    return Tool(name=name, description=f"[{server}] {description}", parameters=parameters,
                requires_approval=not read_only, read_only=read_only, idempotent=idempotent, run=run)


def result_text(result: Any) -> str:
    """The text of a tool result: text blocks joined, other blocks summarized in brackets."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {res.uri} {res.mime_type or ''}]".strip())
        else:
            parts.append(f"[{kind} content]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


class _Server:
    """One running MCP server. Its transport and session live in a single task (`_serve`), since
    anyio's context managers must be entered and exited by the same task."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.session: ClientSession | None = None
        self.listed: list[mcp_types.Tool] = []
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        # A file, not a pipe: nobody has to drain it, and its tail explains a failed start.
        self.errlog: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        self.task: asyncio.Task[None] | None = None

    def params(self) -> StdioServerParameters:
        env = {"PATH": os.environ.get("PATH") or os.defpath, "HOME": os.environ.get("HOME", "/")}
        return StdioServerParameters(command=self.config.command, args=list(self.config.args),
                                     env=env | dict(self.config.env))

    async def serve(self) -> None:
        try:
            async with stdio_client(self.params(), errlog=self.errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self.listed = await _list_all(session)
                    self.session = session
                    self.ready.set_result(None)
                    await self.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported through `ready`, or logged
            if not self.ready.done():
                self.ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            elif not self.stop.is_set():
                log.warning("MCP server %r stopped: %s", self.config.name, _describe(exc))
            if not isinstance(exc, Exception):  # cancellation, interpreter exit
                raise
        finally:
            self.session = None

    @property
    def alive(self) -> bool:
        return self.session is not None and self.task is not None and not self.task.done()

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self.errlog.flush()
            size = self.errlog.seek(0, os.SEEK_END)
            self.errlog.seek(max(0, size - _STDERR_TAIL))
            return self.errlog.read().strip()
        return ""

    async def close(self, timeout: float) -> None:
        self.stop.set()
        if self.task is not None and not self.task.done() and self.session is None:
            self.task.cancel()  # still starting (or hung in the handshake): nothing to shut down politely
        if self.task is not None and not self.task.done():
            try:
                async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel on 3.11
                    await asyncio.shield(self.task)
            except BaseException:  # noqa: BLE001 - a stuck shutdown is cut short, not propagated
                self.task.cancel()
                with contextlib.suppress(BaseException):
                    await self.task
        if self.ready.done() and not self.ready.cancelled():
            self.ready.exception()  # mark it retrieved: add() may have stopped waiting for it
        self.errlog.close()


async def _list_all(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(
            params=mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _describe(exc: BaseException) -> str:
    """A readable one-liner, unwrapping the exception groups anyio likes to raise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class McpTools:
    """The tools of a set of MCP servers. Use `async with McpTools(configs) as mcp:` or start()/close().

    start() starts every server concurrently; one that fails is logged and kept in `errors`, and the
    others still work. add() starts one server and raises McpStartError if it fails.
    """

    def __init__(self, configs: Sequence[McpServerConfig] = (), *, start_timeout: float = 20.0,
                 call_timeout: float = 60.0, stop_timeout: float = 5.0) -> None:
        self.configs = list(configs)
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self.stop_timeout = stop_timeout
        self.errors: dict[str, McpStartError] = {}
        self._servers: dict[str, _Server] = {}
        self._tools: dict[str, list[Tool]] = {}

    async def __aenter__(self) -> McpTools:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        results = await asyncio.gather(*(self.add(c) for c in self.configs), return_exceptions=True)
        for config, result in zip(self.configs, results):
            if isinstance(result, McpStartError):
                log.error("%s", result)
            elif isinstance(result, BaseException):
                raise result

    async def add(self, config: McpServerConfig) -> list[Tool]:
        """Start one server and return its tools; McpStartError if it cannot start."""
        if not LLM_NAME.fullmatch(config.name) or SEPARATOR in config.name:
            raise McpStartError(config, f"server name must match {LLM_NAME.pattern} without {SEPARATOR!r}")
        if config.name in self._servers:
            raise McpStartError(config, "a server with this name is already running")
        server = _Server(config)
        self._servers[config.name] = server
        server.task = asyncio.create_task(server.serve(), name=f"mcp:{config.name}")
        try:
            async with asyncio.timeout(self.start_timeout):  # not wait_for: it can swallow a cancel on 3.11
                await asyncio.shield(server.ready)
        except BaseException as exc:
            reason = (f"no handshake within {self.start_timeout:g}s" if isinstance(exc, TimeoutError)
                      else _describe(exc))
            tail = server.stderr_tail()
            del self._servers[config.name]
            await server.close(self.stop_timeout)
            if isinstance(exc, asyncio.CancelledError):
                raise
            error = McpStartError(config, reason + (f"\nstderr:\n{tail}" if tail else ""))
            self.errors[config.name] = error
            raise error from None
        self.errors.pop(config.name, None)
        self._tools[config.name] = self._build_tools(server)
        return list(self._tools[config.name])

    async def remove(self, name: str) -> None:
        """Stop one server; its tools go away (callers should also `registry.unregister_prefix`)."""
        server = self._servers.pop(name, None)
        self._tools.pop(name, None)
        if server is not None:
            await server.close(self.stop_timeout)

    async def close(self) -> None:
        servers = list(self._servers.values())
        self._servers.clear()
        self._tools.clear()
        await asyncio.gather(*(s.close(self.stop_timeout) for s in servers), return_exceptions=True)

    def tools(self) -> list[Tool]:
        return [tool for name in sorted(self._tools) for tool in self._tools[name]]

    def alive(self, name: str) -> bool:
        server = self._servers.get(name)
        return server is not None and server.alive

    def _build_tools(self, server: _Server) -> list[Tool]:
        prefix = server.config.name + SEPARATOR
        tools: list[Tool] = []
        taken: set[str] = set()
        for listed in server.listed:
            name = prefix + sanitize_name(listed.name, _NAME_LIMIT - len(prefix))
            suffix = 2
            while name in taken:  # two MCP names that sanitize alike: keep both, distinctly
                tag = f"_{suffix}"
                name = prefix + sanitize_name(listed.name, _NAME_LIMIT - len(prefix) - len(tag)) + tag
                suffix += 1
            taken.add(name)
            tools.append(tool_from_mcp(server.config.name, listed, name, self._runner(server.config.name, listed.name)))
        return tools

    def _runner(self, server_name: str, mcp_name: str) -> Runner:
        async def run(args: dict[str, Any], ctx: ToolContext) -> str:
            server = self._servers.get(server_name)
            session = server.session if server is not None and server.alive else None
            if session is None:
                raise ToolError(f"MCP server {server_name!r} is not running")
            try:
                async with asyncio.timeout(self.call_timeout):
                    result = await session.call_tool(mcp_name, args)
            except TimeoutError:
                raise ToolError(f"MCP tool {mcp_name!r} on {server_name!r} timed out after "
                                f"{self.call_timeout:g}s") from None
            except Exception as exc:  # noqa: BLE001 - the model hears about it; the server keeps going
                raise ToolError(f"MCP server {server_name!r} failed on {mcp_name!r}: {_describe(exc)}") from None
            text = result_text(result)
            if getattr(result, "is_error", False):
                raise ToolError(text or f"MCP tool {mcp_name!r} reported an error")
            return text
        return run
