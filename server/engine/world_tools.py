"""Which tools exist in a world: the built-ins, plus the tools of the world's MCP servers."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..tools.base import Tool
from ..tools.mcp import McpServerConfig, McpTools
from ..tools.registry import ToolRegistry

log = logging.getLogger(__name__)


def mcp_configs(settings: dict[str, Any]) -> tuple[McpServerConfig, ...]:
    return tuple(McpServerConfig(name=s["name"], command=s["command"], args=list(s.get("args") or []),
                                 env=dict(s.get("env") or {})) for s in settings.get("mcp_servers") or ())


class WorldTools:
    """Built-in tools for every world; each world's MCP servers started while it is hosted."""

    def __init__(self, builtins: ToolRegistry) -> None:
        self.builtins = builtins
        self._mcp: dict[str, McpTools] = {}
        self._configs: dict[str, tuple[McpServerConfig, ...]] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}

    def sync(self, world: str, settings: dict[str, Any]) -> None:
        """(Re)start the world's MCP servers in the background when its configuration changed."""
        configs = mcp_configs(settings)
        if self._configs.get(world, ()) == configs:
            return
        self._configs[world] = configs
        previous = self._starting.pop(world, None)
        self._starting[world] = asyncio.create_task(self._restart(world, configs, previous))

    async def _restart(self, world: str, configs: tuple[McpServerConfig, ...],
                       previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        old = self._mcp.pop(world, None)
        if old is not None:
            await old.close()
        if configs:
            mcp = McpTools(configs)
            await mcp.start()  # a server that fails is logged and left out; the others work
            self._mcp[world] = mcp

    async def tools(self, world: str) -> list[Tool]:
        starting = self._starting.get(world)
        if starting is not None and not starting.done():
            await asyncio.gather(starting, return_exceptions=True)
        mcp = self._mcp.get(world)
        return self.builtins.all() + (mcp.tools() if mcp else [])

    def errors(self, world: str) -> dict[str, str]:
        mcp = self._mcp.get(world)
        return {name: str(error) for name, error in (mcp.errors.items() if mcp else ())}

    async def close(self, world: str) -> None:
        self._configs.pop(world, None)
        starting = self._starting.pop(world, None)
        if starting is not None:
            await asyncio.gather(starting, return_exceptions=True)
        mcp = self._mcp.pop(world, None)
        if mcp is not None:
            await mcp.close()
