"""The page's sign-in of OAuth MCP servers (issue #33): the owner asks for the authorization URL and gets
a link to open deliberately, with its host shown plainly (server/api/mcp_sign_in.py has the callback)."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server.api.context import context_of
from server.api.mcp_sign_in import callback_url
from server.errors import AppError

from .manage import _owner, _toasting, mcp_context
from .render import render


async def _server(request: Request, world: str, name: str) -> dict[str, Any]:
    servers: list[dict[str, Any]] = mcp_context(await context_of(request).engine.get_world(world))["mcp_servers"]
    found = [s for s in servers if s["name"] == name]
    if not found:
        raise AppError("not_found", f"no MCP server {name!r}", 404)
    return found[0]


@_toasting
async def sign_in(request: Request) -> Response:
    """POST /w/{world}/mcp/{name}/sign-in: the server's sign-in controls, with the link to open."""
    world, name = request.path_params["world"], request.path_params["name"]
    actor = await _owner(request, world, f"sign in to MCP server {name}")
    ctx = context_of(request)
    started: dict[str, Any] | None = None
    error = ""
    try:
        started = await ctx.engine.mcp_sign_ins.start(world, actor, name, callback_url(ctx.public_url))
    except AppError as exc:
        error = exc.message
    return HTMLResponse(render("_mcp_sign_in.html", world_id=world, s=await _server(request, world, name),
                               sign_in=started, sign_in_error=error))


@_toasting
async def sign_out(request: Request) -> Response:
    """POST /w/{world}/mcp/{name}/sign-out: revoke and delete its tokens; the controls again."""
    world, name = request.path_params["world"], request.path_params["name"]
    actor = await _owner(request, world, f"sign out of MCP server {name}")
    await context_of(request).engine.mcp_sign_ins.sign_out(world, actor, name)
    return HTMLResponse(render("_mcp_sign_in.html", world_id=world, s=await _server(request, world, name)))
