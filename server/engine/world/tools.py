"""Which tools exist in a world: the built-ins, plus the tools of the world's MCP servers.

A world's MCP servers start when its tools are first needed (an agent's turn, `GET /api/worlds/{w}`),
one session per server per world in this process; they stop when the world is deleted or unhosted.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import offload, vocab
from ...redact import redact_text, remember_secret
from ...tools.base import Tool, ToolContext
from ...tools.egress.hosts import network_mode
from ...tools.mcp.content import RESULT_LIMIT
from ...tools.mcp.oauth import VaultStorage
from ...tools.mcp.oauth_vault import Vault
from ...tools.mcp.policy import ToolOverride
from ...tools.mcp.tools import ElicitAsker, McpServerConfig, McpTools
from ...tools.registry import ToolRegistry
from ...tools.sandbox import bubblewrap as sandbox
from ...webhooks.settings import remember_webhook_secrets
from .status import StatusBoard

logger = logging.getLogger(__name__)

DEFAULT_MCP_TIMEOUT = 60.0


def remember_mcp_secrets(settings: dict[str, Any]) -> tuple[McpServerConfig, ...]:
    """The world's MCP servers, their env, header and secret argument values now hidden wherever shown."""
    remember_webhook_secrets(settings)  # a world's webhook URLs and secrets: read where its MCP secrets are
    configs = mcp_configs(settings)
    for config in configs:
        for value in config.secrets():
            remember_secret(value)
    return configs


def mcp_configs(settings: dict[str, Any]) -> tuple[McpServerConfig, ...]:
    network = settings.get("sandbox_network") is True  # `ask` gives MCP servers none: it asks per call
    return tuple(McpServerConfig(name=s["name"], command=s.get("command") or "", args=list(s.get("args") or []),
                                 env=dict(s.get("env") or {}), url=s.get("url") or "",
                                 headers=dict(s.get("headers") or {}), oauth=bool(s.get("oauth")),
                                 oauth_client=dict(s["oauth"]) if isinstance(s.get("oauth"), dict) else None,
                                 trusted=bool(s.get("trusted")),
                                 network=network,
                                 overrides={t: ToolOverride.parse(o) for t, o in (s.get("tools") or {}).items()})
                 for s in settings.get("mcp_servers") or ())


def _redacted(value: Any) -> Any:
    """A status with secret-looking values hidden in its texts (reasons, stderr tails)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value


def _merged(local: dict[str, Any], seen: dict[str, Any] | None) -> dict[str, Any]:
    """A server's status: the state last said on the bus (by whichever process runs it), over this
    process's own (its details: stderr tail, calls, when it runs the server too)."""
    if seen is None:
        return local
    return local | {k: seen.get(k) for k in ("state", "reason", "last_error", "restarts")}


class WorldTools:
    """Built-in tools for every world; each world's MCP servers started while it is hosted."""

    def __init__(self, builtins: ToolRegistry, workspace_for: Callable[[str], Path] | None = None,
                 status: StatusBoard | None = None, elicit: ElicitAsker | None = None) -> None:
        self.builtins = builtins
        self.vault: Vault | None = None  # OAuth servers' sign-ins (the engine's McpSignIns sets it)
        self.elicit = elicit  # puts an MCP server's question to a person (the calling agent's queue)
        self.board = status  # where an MCP call's progress shows (the agent's running-tool status)
        self.workspace_for = workspace_for  # the folder a world's sandboxed MCP servers may write
        self._mcp: dict[str, McpTools] = {}
        self._configs: dict[str, tuple[McpServerConfig, ...]] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._settings: dict[str, dict[str, Any]] = {}
        # Each server's last state said on the bus by any process (`mcp_state` frames): every process
        # hosting the world shows the same state, whichever one runs the server.
        self._seen: dict[str, dict[str, dict[str, Any]]] = {}
        self._telling: set[asyncio.Task[None]] = set()

    def sync(self, world: str, settings: dict[str, Any]) -> None:
        """Note the world's settings; its MCP servers restart (when next needed) if their configuration changed."""
        self._settings[world] = settings
        configs = remember_mcp_secrets(settings)
        mcp = self._mcp.get(world)
        if mcp is not None:
            mcp.call_timeout = float(settings.get("mcp_timeout") or DEFAULT_MCP_TIMEOUT)
            mcp.result_limit = int(settings.get("mcp_result_limit") or RESULT_LIMIT)
        if self._configs.get(world, ()) == configs:
            return
        self._configs[world] = configs
        self._seen.pop(world, None)  # said of the old configuration
        previous = self._starting.pop(world, None)
        if previous is not None or world in self._mcp:  # running: restart now, with the new configuration
            self._starting[world] = asyncio.create_task(self._restart(world, configs, previous))

    def _ensure_started(self, world: str) -> asyncio.Task[None] | None:
        if world not in self._starting and world not in self._mcp and self._configs.get(world):
            self._starting[world] = asyncio.create_task(self._restart(world, self._configs[world], None))
        return self._starting.get(world)

    async def _restart(self, world: str, configs: tuple[McpServerConfig, ...],
                       previous: asyncio.Task[None] | None) -> None:
        offload.working_for(world)  # (its MCP servers' tasks start here: a large result's JSON in the workers)
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        old = self._mcp.pop(world, None)
        if old is not None:
            await old.close()
        if configs:
            workspace = await asyncio.to_thread(self.workspace_for, world) if self.workspace_for else None
            timeout = float(self._settings.get(world, {}).get("mcp_timeout") or DEFAULT_MCP_TIMEOUT)
            limit = int(self._settings.get(world, {}).get("mcp_result_limit") or RESULT_LIMIT)
            vault = self.vault
            mcp = McpTools(configs, workspace=workspace, call_timeout=timeout, result_limit=limit,
                           progress=self._progress,
                           oauth=(lambda config: VaultStorage(vault, world, config)) if vault is not None else None,
                           elicit=self.elicit, on_state=lambda name, status: self._tell(world, name, status))
            self._mcp[world] = mcp  # its status shows `starting` meanwhile
            await mcp.start()  # a server that fails is logged, left out and retried; the others work

    def reconnect(self, world: str, server: str) -> None:
        """A server signed in to or out of (by any process): connect it again, if it runs here."""
        mcp = self._mcp.get(world)
        if mcp is not None:
            task = asyncio.create_task(mcp.restart(server), name=f"mcp-reconnect-{world}-{server}")
            self._telling.add(task)
            task.add_done_callback(self._told)

    def _tell(self, world: str, name: str, status: dict[str, Any]) -> None:
        """A server's new state, as an `mcp_state` frame on the world's channel (every process, every page)."""
        if self.board is None:
            return
        shown = _redacted(status)
        frame = {"type": "mcp_state", "server": name, "state": shown["state"], "reason": shown.get("reason"),
                 "last_error": shown.get("last_error"), "restarts": shown.get("restarts", 0)}
        task = asyncio.create_task(self.board.store.publish(world, frame), name=f"mcp-state-{world}")
        self._telling.add(task)
        task.add_done_callback(self._told)

    def _told(self, task: asyncio.Task[None]) -> None:
        self._telling.discard(task)
        if not task.cancelled() and task.exception() is not None:  # the next change (or page load) says it
            logger.warning("an MCP state change was not published: %s", task.exception())

    def observe(self, world: str, frame: dict[str, Any]) -> None:
        """An `mcp_state` frame from the bus (any process, this one included)."""
        if isinstance(frame.get("server"), str) and world in self._configs:
            self._seen.setdefault(world, {})[frame["server"]] = frame

    async def _progress(self, ctx: ToolContext, tool: str, progress: float, total: float | None,
                        message: str | None) -> None:
        """An MCP call's progress, as a detail of its agent's `running_tool` status frame."""
        if self.board is not None:
            detail = {"progress": progress, "total": total, "message": (message or "")[:200] or None}
            await self.board.set(ctx.world, ctx.agent, vocab.RUNNING_TOOL, chat=ctx.chat, tool=tool,
                                  progress=detail)

    async def tools(self, world: str) -> list[Tool]:
        starting = self._ensure_started(world)
        if starting is not None and not starting.done():
            await asyncio.gather(starting, return_exceptions=True)
        mcp = self._mcp.get(world)
        settings = self._settings.get(world, {})
        builtins = [t.for_settings(settings) if t.for_settings else t for t in self.builtins.all()]
        return builtins + (mcp.tools() if mcp else [])

    def errors(self, world: str) -> dict[str, str]:
        mcp = self._mcp.get(world)
        network = network_mode(self._settings.get(world, {}).get("sandbox_network"))
        return sandbox.tool_errors(network=network) | {name: redact_text(str(error))
                                        for name, error in (mcp.errors.items() if mcp else ())}

    def status(self, world: str) -> dict[str, dict[str, Any]]:
        """Each MCP server of the world: starting, up or failed (reason, stderr tail); `stopped` before first use."""
        mcp = self._mcp.get(world)
        # A server's stderr may print its secrets: every role reads this, as `tool_errors`.
        shown = {name: _redacted(status) for name, status in mcp.status().items()} if mcp is not None else {}
        seen = self._seen.get(world, {})
        return {c.name: _merged(shown.get(c.name) or {"state": "stopped", "reason": None, "stderr_tail": "",
                                                      "restarts": 0, "transport": "http" if c.url else "stdio"},
                                seen.get(c.name))
                for c in self._configs.get(world, ())}

    async def close(self, world: str) -> None:
        self._configs.pop(world, None)
        self._settings.pop(world, None)
        self._seen.pop(world, None)
        starting = self._starting.pop(world, None)
        if starting is not None:
            await asyncio.gather(starting, return_exceptions=True)
        mcp = self._mcp.pop(world, None)
        if mcp is not None:
            await mcp.close()
