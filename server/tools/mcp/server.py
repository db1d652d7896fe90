"""One MCP server: its configuration, and one connection to it (stdio in the sandbox, or streamable HTTP)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..sandbox import bubblewrap as sandbox
from .content import RESULT_LIMIT
from .http_bounds import IDENTITY, ResponseBound
from .masking import masked_args, secret_args
from .oauth_http import oauth_client
from .policy import ToolOverride
from .stdio import LineReader, message_limit, stdio_transport

if TYPE_CHECKING:  # imported where first used (a server connecting): `import mcp` costs ~2 s of startup
    import httpx2
    from mcp import ClientSession, StdioServerParameters
    from mcp import types as mcp_types
    from mcp.client.session import ElicitationFnT

logger = logging.getLogger(__name__)

_STDERR_TAIL = 2000  # characters of a failed server's stderr quoted in errors and the status


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str = ""  # run over stdio; or
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""  # a streamable-HTTP endpoint
    headers: dict[str, str] = field(default_factory=dict)  # sent with every HTTP request (write-only, as env)
    oauth: bool = False  # an HTTP server signed in to with OAuth 2.1 (its tokens in the vault: oauth.py)
    # The client the owner registered at its authorization server (settings.py `_oauth`); None: it registers itself.
    oauth_client: dict[str, str] | None = None
    trusted: bool = False  # the owner's word: its annotations count, and a command runs unsandboxed
    network: bool = False  # its sandbox keeps the network (the world's `sandbox_network`)
    overrides: dict[str, ToolOverride] = field(default_factory=dict)  # the owner's word per MCP tool name

    def command_line(self) -> str:
        """The command line as it may be shown (errors, status, logs): secret arguments masked as in the settings."""
        return self.url or shlex.join([self.command, *masked_args(self.args)])

    def secrets(self) -> list[str]:
        """The values no client may read: env and header values, the arguments the settings mask, and a registered
        OAuth client's secret."""
        client_secret = (self.oauth_client or {}).get("client_secret")
        return [*self.env.values(), *self.headers.values(), *secret_args(self.args),
                *([client_secret] if client_secret else [])]


class McpStartError(Exception):
    """An MCP server could not be started or did not complete its handshake."""

    def __init__(self, config: McpServerConfig, reason: str) -> None:
        super().__init__(f"MCP server {config.name!r} ({config.command_line()}) failed to start: {reason}")
        self.server = config.name
        self.command = config.command_line()
        self.reason = reason


class McpConnection:
    """One session with a server. Its transport and session live in a single task (`serve`), since
    anyio's context managers must be entered and exited by the same task."""

    def __init__(self, config: McpServerConfig, workspace: Path | None = None, *,
                 on_tools_changed: Callable[[], None] | None = None,
                 elicit: ElicitationFnT | None = None,
                 result_limit: Callable[[], int] = lambda: RESULT_LIMIT, auth: httpx2.Auth | None = None) -> None:
        self.config = config
        self.auth = auth  # an OAuth server's tokens, sent and refreshed (oauth.py)
        self.workspace = workspace
        self.session: ClientSession | None = None
        self.listed: list[mcp_types.Tool] = []
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.error: BaseException | None = None  # why it ended, if it ended by itself
        self.lost = asyncio.Event()  # the server's side of the transport ended (a stdio server exited)
        self.on_tools_changed = on_tools_changed
        self.elicit = elicit  # answers a server's elicitation request (passing one advertises the capability)
        # A file, not a pipe: nobody has to drain it, and its tail explains a failed start.
        self.errlog: TextIO = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        self.task: asyncio.Task[None] | None = None
        # A message (a stdio server's line, an HTTP server's body or SSE event) is read up to a bound that
        # follows the world's result limit.
        self.message_limit = lambda: message_limit(result_limit())
        self.reader = LineReader(self.message_limit)
        self.http_bound = ResponseBound(self.message_limit)

    def params(self) -> StdioServerParameters:
        from mcp import StdioServerParameters  # imported when first used: `import mcp` costs ~2 s of startup
        path = os.environ.get("PATH") or os.defpath
        config = self.config
        if config.trusted or not sandbox.status().sandboxed:
            env = {"PATH": path, "HOME": os.environ.get("HOME", "/")} | dict(config.env)
            # Unsandboxed, still a tool process: it yields the CPU to the server, as a sandboxed one does (a
            # 20 MB result's serializing otherwise took a core from every world's requests). The command is
            # found as the server's own start would find it: on the PATH it is given.
            nice, command = shutil.which("nice", path=path), shutil.which(config.command, path=env.get("PATH"))
            if nice is None or command is None:  # (no `nice`: as it is; not found: its start fails, and says so)
                return StdioServerParameters(command=config.command, args=list(config.args), env=env)
            args = ["-n", str(sandbox.SERVER_LIMITS.niceness), "--", command, *config.args]
            return StdioServerParameters(command=nice, args=args, env=env)
        # Built from nothing: bwrap's own environment is readable inside, so it holds only the server's.
        home = str(self.workspace.resolve()) if self.workspace else "/tmp"
        env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8"} | dict(config.env)
        command = shutil.which(config.command, path=path) or config.command
        argv = sandbox.wrap([command, *config.args], workspace=self.workspace, network=config.network,
                            limits=sandbox.SERVER_LIMITS, read_only=_named_paths([command, *config.args]))
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env)

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        # Imported when first used: `import mcp` costs ~2 s of startup.
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
        if self.config.url:
            # An OAuth server's refreshes go where its authorization server's metadata says: checked (oauth_http.py).
            client = (await oauth_client(self.config.url, headers=dict(self.config.headers), auth=self.auth,
                                         read_limit=None) if self.config.oauth
                      else create_mcp_http_client(headers=dict(self.config.headers), auth=self.auth))
            async with client:
                client.headers.update(IDENTITY)
                client.event_hooks["response"] += [self._note_http_error, self.http_bound]
                # The SDK's own SSE event bound (a fixed 1 MiB) is replaced by ours, which follows the world's.
                async with streamable_http_client(self.config.url, http_client=client,
                                                  max_sse_event_size=None) as (read, write):
                    yield read, write
        else:
            async with stdio_transport(self.params(), self.errlog, self.reader) as (read, write):
                yield read, write

    async def _note_http_error(self, response: Any) -> None:
        """An HTTP server's refusals go where a stdio server's stderr goes: they explain a failure."""
        if response.status_code >= 400:
            self.errlog.write(f"HTTP {response.status_code} {response.reason_phrase} "
                              f"for {response.request.method} {self.config.url}\n")

    async def _on_message(self, message: Any) -> None:
        from mcp import types as mcp_types  # loaded by then: the session imported it
        if isinstance(message, mcp_types.ToolListChangedNotification) and self.session is not None:
            asyncio.get_running_loop().create_task(self._relist(), name=f"mcp-relist:{self.config.name}")

    async def _relist(self) -> None:
        session = self.session
        if session is None:
            return
        try:
            self.listed = await list_all_tools(session)
        except Exception as exc:  # the old list stays; the model hears of a vanished tool when it calls it
            logger.warning("MCP server %r: could not list its changed tools: %s", self.config.name, describe(exc))
            return
        if self.on_tools_changed is not None:
            self.on_tools_changed()

    async def serve(self) -> None:
        from mcp import ClientSession  # imported when first used: `import mcp` costs ~2 s of startup
        lost = self.lost
        try:
            async with self._transport() as (read, write):
                async with ClientSession(_Watched(read, lost), write, message_handler=self._on_message,
                                         elicitation_callback=self.elicit) as session:
                    await session.initialize()
                    self.listed = await list_all_tools(session)
                    self.session = session
                    self.ready.set_result(None)
                    await _first(self.stop.wait(), lost.wait())
                    if not self.stop.is_set():
                        raise ConnectionError("the server closed the connection")
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            elif not self.stop.is_set():
                self.error = exc
                logger.warning("MCP server %r stopped: %s", self.config.name, describe(exc))
            if not isinstance(exc, Exception):  # cancellation, interpreter exit
                raise
        finally:
            self.session = None
        if not self.stop.is_set() and self.error is None:
            self.error = ConnectionError("the server closed the connection")

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
        """Stop the session (cut short after `timeout`). A cancel of the caller still stops it, then goes on."""
        self.stop.set()
        try:
            if self.task is not None and not self.task.done() and self.session is None:
                self.task.cancel()  # still starting (or hung in the handshake): nothing to shut down politely
            if self.task is not None and not self.task.done():
                try:
                    async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel on 3.11
                        await asyncio.shield(self.task)
                except BaseException as exc:  # a stuck shutdown is cut short, not propagated
                    self.task.cancel()
                    current = asyncio.current_task()
                    if isinstance(exc, asyncio.CancelledError) and current is not None and current.cancelling():
                        raise  # the caller is cancelled, not the session: its cancel is not ours to drop
                    await asyncio.wait([self.task])  # its outcome is `error` (see serve); a cancel of ours goes on
        finally:
            if self.ready.done() and not self.ready.cancelled():
                self.ready.exception()  # mark it retrieved: a starter may have stopped waiting for it
            self.errlog.close()


class _Watched:
    """A transport's read stream that tells when it ends: the session alone would wait for ever."""

    def __init__(self, stream: Any, ended: asyncio.Event) -> None:
        self._stream, self._ended = stream, ended

    async def __aenter__(self) -> _Watched:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        self._ended.set()
        return await self._stream.__aexit__(*exc_info)

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            self._ended.set()
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


async def _first(*waits: Any) -> None:
    """Wait until the first of `waits` (coroutines) is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def list_all_tools(session: ClientSession) -> list[mcp_types.Tool]:
    """Every page of `tools/list`."""
    from mcp import types as mcp_types  # loaded by then: the session imported it
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(1000):  # a server whose cursors never end stops here
        page = await session.list_tools(
            params=mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _named_paths(argv: Sequence[str]) -> list[Path]:
    """Absolute paths on the server's command line (its program, its script), shown read-only."""
    return [Path(arg) for arg in argv if os.path.isabs(arg) and os.path.exists(arg)]


def innermost(exc: BaseException) -> BaseException:
    """The error inside the exception groups anyio likes to raise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    """A readable one-liner, unwrapping the exception groups anyio likes to raise."""
    exc = innermost(exc)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
