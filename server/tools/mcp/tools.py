"""Tools from MCP servers (stdio or streamable HTTP), exposed to the LLM as `<server>__<tool>`.

Each configured server has a supervisor: it starts the server, keeps its tools, and restarts it
with backoff when it dies; its state (starting, up, failed with the reason and stderr tail) is
`McpTools.status()`.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ...aio import import_in_thread
from ...redact import hide_known, in_worker
from ...vocab import LLM_NAME
from ..base import Runner, Tool, ToolContext, ToolError
from ..sandbox import bubblewrap as sandbox
from .content import RESULT_LIMIT, is_large, result_text, shown_text
from .oauth import SignInNeeded, VaultStorage, connection_auth
from .policy import ToolOverride, tool_policy
from .server import McpConnection, McpServerConfig, McpStartError, describe

if TYPE_CHECKING:  # imported where first used (a server connecting): `import mcp` costs ~2 s of startup
    from mcp import types as mcp_types

__all__ = ["McpServerConfig", "McpStartError", "McpTools", "result_text", "sanitize_name", "tool_from_mcp"]

logger = logging.getLogger(__name__)

SEPARATOR = "__"
_NAME_LIMIT = 64
URL_ELICITATION_REQUIRED = -32042  # a call refused until a person has opened the links the error lists
MAX_LINKS = 5  # links one such refusal may ask for (as many as a call may have questions open)
State = Literal["starting", "up", "failed"]
# (context of the call, its tool as the LLM names it, the server's question): a person's answer
ElicitAsker = Callable[[ToolContext, str, "mcp_types.ElicitRequestParams"], Awaitable["mcp_types.ElicitResult"]]
# (context of the call, its tool as the LLM names it, progress, total, message): shows a call's progress
ProgressHandler = Callable[[ToolContext, str, float, "float | None", "str | None"], Awaitable[None]]
# (server name, its status): told each time a server's state changes, so it can be shown live
StateHandler = Callable[[str, dict[str, Any]], None]
# an OAuth server's token storage (its record in the vault), for its connections
OAuthStorage = Callable[[McpServerConfig], VaultStorage]


def sanitize_name(name: str, limit: int = _NAME_LIMIT) -> str:
    """`name` made acceptable to the LLM: invalid characters become `_`, cut to `limit`."""
    cleaned = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:limit]
    return cleaned or "_"


def tool_from_mcp(server: str, listed: mcp_types.Tool, name: str, run: Runner, *, trusted: bool = False,
                  override: ToolOverride | None = None) -> Tool:
    """A Tool for one listed MCP tool; its annotations count only when the server is trusted."""
    hints = listed.annotations
    policy = tool_policy(hints, trusted=trusted, override=override)
    schema = listed.input_schema if isinstance(listed.input_schema, dict) else {}
    parameters = dict(schema) or {"type": "object", "properties": {}}
    parameters.setdefault("type", "object")
    description = listed.description or (hints.title if hints and hints.title else "") or listed.name
    return Tool(name=name, description=f"[{server}] {description}", parameters=parameters,
                requires_approval=policy.requires_approval, read_only=policy.read_only,
                idempotent=policy.idempotent, run=run)


def tool_names(server: str, listed: Sequence[str]) -> list[str]:
    """`<server>__<tool>` for each listed name, sanitised; a clash gets a stable suffix (`_2`, `_3`, in
    the server's order)."""
    prefix = server + SEPARATOR
    names: list[str] = []
    taken: set[str] = set()
    for mcp_name in listed:
        name = prefix + sanitize_name(mcp_name, _NAME_LIMIT - len(prefix))
        suffix = 2
        while name in taken:
            tag = f"_{suffix}"
            name = prefix + sanitize_name(mcp_name, _NAME_LIMIT - len(prefix) - len(tag)) + tag
            suffix += 1
        taken.add(name)
        names.append(name)
    return names


@dataclass
class _Call:
    """A call in flight: an elicitation is attributed to the oldest; its deadline keeps running meanwhile."""
    ctx: ToolContext
    tool: str
    questions: set[asyncio.Task[mcp_types.ElicitResult]] = field(default_factory=set)  # asked, unanswered


def _close_questions(call: _Call) -> None:
    """Close the questions still waiting as interrupted: nobody waits for their answer any more."""
    for question in call.questions:
        question.cancel()


class _LinksWanted(Exception):
    """A call refused until a person has opened these links (URL elicitations required, -32042)."""

    def __init__(self, links: list[mcp_types.ElicitRequestURLParams]) -> None:
        super().__init__(f"{len(links)} links to open")
        self.links = links


@dataclass
class _Slot:
    """One configured server: its current connection, its state and tools, and its supervisor."""
    config: McpServerConfig
    conn: McpConnection | None = None
    state: State = "starting"
    reason: str = ""
    stderr_tail: str = ""
    restarts: int = 0
    last_error: dict[str, str] | None = None  # why it last failed or died, kept after a restart
    tools: list[Tool] = field(default_factory=list)
    first: asyncio.Future[None] | None = None  # the outcome of the first start
    supervisor: asyncio.Task[None] | None = None
    inflight: list[_Call] = field(default_factory=list)  # calls running now, oldest first

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason or None, "stderr_tail": self.stderr_tail,
                "restarts": self.restarts, "transport": "http" if self.config.url else "stdio",
                "last_error": self.last_error, "calls": len(self.inflight)}


class McpTools:
    """The tools of a set of MCP servers. Use `async with McpTools(configs) as mcp:` or start()/close().

    start() starts every server concurrently; one that fails is logged and kept in `errors`, and the
    others still work. add() starts one server and raises McpStartError if its first start fails.
    Either way a server that fails or dies is started again after a backoff (`restart_delay`,
    doubling up to `restart_max`), until it is removed.
    """

    def __init__(self, configs: Sequence[McpServerConfig] = (), *, start_timeout: float = 20.0,
                 call_timeout: float = 60.0, stop_timeout: float = 5.0, workspace: Path | None = None,
                 result_limit: int = RESULT_LIMIT,
                 restart_delay: float = 1.0, restart_max: float = 60.0,
                 elicit: ElicitAsker | None = None, progress: ProgressHandler | None = None,
                 on_state: StateHandler | None = None, oauth: OAuthStorage | None = None) -> None:
        self.configs = list(configs)
        self.oauth = oauth  # where an OAuth server's sign-in is kept (None: such servers do not start)
        self.on_state = on_state
        self.workspace = workspace  # the only folder a sandboxed server may write (None: a private /tmp)
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout  # runs on while the call's questions wait for a person
        self.result_limit = result_limit  # bytes of a result kept (text and binary); the rest is cut, with a note
        self.stop_timeout = stop_timeout
        self.restart_delay, self.restart_max = restart_delay, restart_max
        self.elicit = elicit  # answers a server's elicitation requests (None: not advertised)
        self.progress = progress  # shows a call's progress notifications (on the running step)
        self.errors: dict[str, McpStartError] = {}
        self._slots: dict[str, _Slot] = {}

    async def __aenter__(self) -> McpTools:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        results = await asyncio.gather(*(self.add(c) for c in self.configs), return_exceptions=True)
        for result in results:
            if isinstance(result, McpStartError):
                logger.error("%s", result)
            elif isinstance(result, BaseException):
                raise result

    async def add(self, config: McpServerConfig) -> list[Tool]:
        """Start one server and return its tools; McpStartError if its first start fails."""
        if not LLM_NAME.fullmatch(config.name) or SEPARATOR in config.name:
            raise McpStartError(config, f"server name must match {LLM_NAME.pattern} without {SEPARATOR!r}")
        if config.name in self._slots:
            raise McpStartError(config, "a server with this name is already running")
        slot = self._slots[config.name] = _Slot(config, first=asyncio.get_running_loop().create_future())
        slot.supervisor = asyncio.create_task(self._supervise(slot), name=f"mcp:{config.name}")
        assert slot.first is not None
        await asyncio.shield(slot.first)
        return list(slot.tools)

    async def _supervise(self, slot: _Slot) -> None:
        delay = self.restart_delay
        while True:
            self._set(slot, "starting", "")
            began = time.monotonic()
            try:
                conn = await self._connect(slot)
            except McpStartError as error:
                self.errors[slot.config.name] = error
                self._set(slot, "failed", error.reason)
                if slot.first is not None and not slot.first.done():
                    slot.first.set_exception(error)
            else:
                self.errors.pop(slot.config.name, None)
                slot.conn = conn
                slot.tools = self._build_tools(slot, conn)
                self._set(slot, "up", "")
                if slot.first is not None and not slot.first.done():
                    slot.first.set_result(None)
                assert conn.task is not None
                await asyncio.wait([conn.task])
                slot.stderr_tail = conn.stderr_tail()
                await conn.close(self.stop_timeout)
                reason = describe(conn.error) if conn.error else "stopped"
                self._set(slot, "failed", f"the server died: {reason}")
                if time.monotonic() - began > self.restart_max:
                    delay = self.restart_delay  # it ran well for a while: start over with a short wait
            slot.restarts += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.restart_max)

    async def _connect(self, slot: _Slot) -> McpConnection:
        """A started connection, or McpStartError with the reason and the server's stderr tail."""
        config = slot.config
        if not config.url and not config.trusted and not sandbox.status().tools_allowed:
            raise McpStartError(config, sandbox.status().refusal())
        if not config.url and self.workspace is not None and not config.trusted and sandbox.status().sandboxed:
            await asyncio.to_thread(sandbox.prepare_workspace, self.workspace)
        await import_in_thread("mcp")  # the first connection imports the SDK
        auth = None
        if config.oauth:
            if self.oauth is None:
                raise McpStartError(config, "OAuth sign-in is not available here")
            try:
                auth = await connection_auth(config, self.oauth(config))
            except SignInNeeded as exc:
                raise McpStartError(config, str(exc)) from None
        conn = McpConnection(config, self.workspace, elicit=self._elicit_for(slot) if self.elicit else None,
                             on_tools_changed=lambda: self._tools_changed(slot, conn),
                             result_limit=lambda: self.result_limit, auth=auth)
        conn.task = asyncio.create_task(conn.serve(), name=f"mcp-session:{config.name}")
        try:
            async with asyncio.timeout(self.start_timeout):  # not wait_for: it can swallow a cancel on 3.11
                await asyncio.shield(conn.ready)
        except BaseException as exc:
            reason = (f"no handshake within {self.start_timeout:g}s" if isinstance(exc, TimeoutError)
                      else describe(exc))
            slot.stderr_tail = tail = conn.stderr_tail()
            await conn.close(self.stop_timeout)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise McpStartError(config, reason + (f"\nstderr:\n{tail}" if tail else "")) from None
        slot.stderr_tail = conn.stderr_tail()
        return conn

    def _set(self, slot: _Slot, state: State, reason: str) -> None:
        slot.state, slot.reason = state, reason
        if state == "failed":
            slot.last_error = {"reason": reason, "stderr_tail": slot.stderr_tail}
        if self.on_state is not None:
            self.on_state(slot.config.name, slot.status())

    def _tools_changed(self, slot: _Slot, conn: McpConnection) -> None:
        if slot.conn is conn:
            slot.tools = self._build_tools(slot, conn)

    async def restart(self, name: str) -> None:
        """Start one server again now (a sign-in changed), its backoff from the start."""
        slot = self._slots.get(name)
        if slot is None:
            return
        await self.remove(name)
        with contextlib.suppress(McpStartError):  # failed: its state says why, and it is retried
            await self.add(slot.config)

    async def remove(self, name: str) -> None:
        """Stop one server; its tools go away (callers should also `registry.unregister_prefix`)."""
        slot = self._slots.pop(name, None)
        self.errors.pop(name, None)
        if slot is not None:
            await self._stop(slot)

    async def _stop(self, slot: _Slot) -> None:
        if slot.supervisor is not None:
            slot.supervisor.cancel()
            with contextlib.suppress(BaseException):
                await slot.supervisor
        if slot.conn is not None:
            await slot.conn.close(self.stop_timeout)
        if slot.first is not None and slot.first.done() and not slot.first.cancelled():
            slot.first.exception()  # mark it retrieved: add() may have stopped waiting for it

    async def close(self) -> None:
        slots = list(self._slots.values())
        self._slots.clear()
        await asyncio.gather(*(self._stop(s) for s in slots), return_exceptions=True)

    def tools(self) -> list[Tool]:
        return [tool for name in sorted(self._slots) for tool in self._slots[name].tools]

    def status(self) -> dict[str, dict[str, Any]]:
        """Each server's state: starting, up, or failed (with the reason and its stderr tail)."""
        return {name: slot.status() for name, slot in sorted(self._slots.items())}

    def alive(self, name: str) -> bool:
        slot = self._slots.get(name)
        return slot is not None and slot.conn is not None and slot.conn.alive

    def _build_tools(self, slot: _Slot, conn: McpConnection) -> list[Tool]:
        config = slot.config
        names = tool_names(config.name, [listed.name for listed in conn.listed])
        return [tool_from_mcp(config.name, listed, name, self._runner(config.name, listed.name, name),
                              trusted=config.trusted, override=config.overrides.get(listed.name))
                for listed, name in zip(conn.listed, names, strict=True)]

    def _elicit_for(self, slot: _Slot) -> Any:
        asker = self.elicit

        async def on_elicit(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
            # Stdio carries no link from the question to the call that caused it: the oldest call asks.
            if asker is None or not slot.inflight:
                from mcp import types as mcp_types  # loaded by then: this server's connection imported it
                return mcp_types.ElicitResult(action="decline")
            return await self._ask(slot.inflight[0], params)
        return on_elicit

    async def _ask(self, call: _Call, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        """A person's answer to a question of `call`'s server (`elicit` is set)."""
        assert self.elicit is not None
        # The call's deadline keeps running: a server cannot hold its caller by asking (issue #30).
        # When the call ends (its deadline, a stop), its questions still waiting are closed.
        question = asyncio.ensure_future(self.elicit(call.ctx, call.tool, params))
        call.questions.add(question)
        try:
            return await question
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if question.cancelled() and not (current is not None and current.cancelling()):
                from mcp import types as mcp_types  # loaded by then: this server's connection imported it
                return mcp_types.ElicitResult(action="cancel")  # the call ended: nobody waits for it
            raise
        finally:
            call.questions.discard(question)

    def _links_wanted(self, refused: Exception, mcp_name: str) -> list[mcp_types.ElicitRequestURLParams] | None:
        """The links `refused` asks a person to open before the call can go on (-32042, the MCP server's URL
        elicitations required), checked as the protocol shapes them; None when it is another error (or such
        questions cannot be asked here), which then goes to the model as it came."""
        data = getattr(refused, "data", None)
        if getattr(refused, "code", None) != URL_ELICITATION_REQUIRED or self.elicit is None or not isinstance(
                data, dict) or not isinstance(listed := data.get("elicitations"), list):
            return None
        if not 0 < len(listed) <= MAX_LINKS:  # (counted before anything of it is read)
            raise ToolError(f"MCP tool {mcp_name!r} asked for {len(listed)} links to be opened before it goes on "
                            f"(at most {MAX_LINKS}): not asked")
        from mcp import types as mcp_types  # loaded by then: the call's connection imported it
        try:
            return [mcp_types.ElicitRequestURLParams.model_validate(link) for link in listed]
        except ValueError:  # (pydantic's ValidationError is one)
            return None

    async def _open_links(self, links: list[mcp_types.ElicitRequestURLParams], call: _Call, mcp_name: str) -> None:
        """Ask a person to open each link, one after another, as the server's own URL questions are asked
        (each waits as long as any question); a ToolError when one was not answered Done."""
        for link in links:
            answer = await self._ask(call, link)
            if answer.action != "accept":
                reason = (answer.meta or {}).get("reason")
                raise ToolError(f"MCP tool {mcp_name!r} needs a person to open a link first "
                                f"({hide_known(str(link.message))[:200]!r}); "
                                + (f"it was not asked: {reason}" if reason else f"the answer was {answer.action}"))

    def _progress_for(self, ctx: ToolContext, tool: str) -> Any:
        handler = self.progress
        if handler is None:
            return None

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            try:
                await handler(ctx, tool, progress, total, message)
            except Exception:  # progress is a courtesy: the call goes on without it
                logger.debug("progress of %s not shown", tool, exc_info=True)
        return on_progress

    async def _call_once(self, slot: _Slot, mcp_name: str, args: dict[str, Any], call: _Call, *,
                         again: bool = False) -> Any:
        """`mcp_name` called on the slot's connection now, within `call_timeout`; its failure as a ToolError
        for the model, or _LinksWanted when it wants links opened first (and may still ask for them)."""
        server_name = slot.config.name
        conn = slot.conn
        session = conn.session if conn is not None and conn.alive else None
        if conn is None or session is None:
            state = f" ({slot.state}: {slot.reason})" if slot.reason else ""
            raise ToolError(f"MCP server {server_name!r} is not running{state}")
        # In flight only while a request of it is open at the server: the server's questions meanwhile are its
        # (stdio tells no more), not those asked while its links wait, between two calls.
        slot.inflight.append(call)
        try:
            async with asyncio.timeout(self.call_timeout):
                progress = self._progress_for(call.ctx, call.tool)
                return await session.call_tool(mcp_name, args, progress_callback=progress)
        except TimeoutError:
            raise ToolError(f"MCP tool {mcp_name!r} on {server_name!r} timed out after "
                            f"{self.call_timeout:g}s") from None
        except Exception as exc:  # the model hears about it; the server keeps going
            if not again and (links := self._links_wanted(exc, mcp_name)) is not None:
                raise _LinksWanted(links) from None
            from mcp_types.jsonrpc import CONNECTION_CLOSED  # loaded by then: the connection imported it
            if not conn.alive or getattr(exc, "code", None) == CONNECTION_CLOSED:
                raise ToolError(f"interrupted: MCP server {server_name!r} ended during {mcp_name!r} "
                                f"({hide_known(describe(exc))})") from None
            raise ToolError(f"MCP server {server_name!r} failed on {mcp_name!r}: "
                            f"{hide_known(describe(exc))}") from None
        finally:
            slot.inflight.remove(call)
            _close_questions(call)

    def _runner(self, server_name: str, mcp_name: str, tool: str) -> Runner:
        async def run(args: dict[str, Any], ctx: ToolContext) -> str:
            slot = self._slots.get(server_name)
            if slot is None:
                raise ToolError(f"MCP server {server_name!r} is not running")
            call = _Call(ctx, tool)
            try:
                try:
                    result = await self._call_once(slot, mcp_name, args, call)
                except _LinksWanted as wanted:  # each opened (answered Done): the call once more, a new deadline
                    await self._open_links(wanted.links, call, mcp_name)
                    result = await self._call_once(slot, mcp_name, args, call, again=True)
            finally:
                _close_questions(call)  # (a link still asked when the run is stopped)
            # A result may echo a secret this server knows: it is hidden here, before it is stored and sent
            # to the LLM, not only on the way out to clients. A 16 MiB one is cut and scanned off the loop.
            text = (await in_worker(shown_text, result, self.result_limit) if is_large(result)
                    else shown_text(result, self.result_limit))
            if getattr(result, "is_error", False):
                raise ToolError(f"MCP tool {mcp_name!r} reported an error: {text}" if text
                                else f"MCP tool {mcp_name!r} reported an error")
            return text
        return run
