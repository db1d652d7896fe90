"""OAuth sign-in of a world's MCP servers over HTTP (docs/protocol.md §5, issue #33).

`POST …/mcp/{server}/sign-in` (the owner) starts one and answers the authorization URL and its host, for a
person to open; `DELETE` signs out. `GET /oauth/callback` is where the authorization server sends the
browser back: it finishes the sign-in this browser's person started and says how it went, in a page that
carries none of what it was given (no code, no token) and sends no referrer on.
"""
from __future__ import annotations

import html
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from ..errors import AppError
from ..redact import redact_text
from .context import context_of
from .http import Call, endpoint

CALLBACK_PATH = "/oauth/callback"
_PAGE_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def callback_url(public_url: str) -> str:
    return public_url.rstrip("/") + CALLBACK_PATH


async def start_sign_in(call: Call) -> dict[str, Any]:
    return await call.ctx.engine.mcp_sign_ins.start(call.world or "", call.actor, call.param("server"),
                                                    callback_url(call.ctx.public_url))


async def sign_out(call: Call) -> dict[str, Any]:
    return await call.ctx.engine.mcp_sign_ins.sign_out(call.world or "", call.actor, call.param("server"))


def _page(title: str, text: str, status: int) -> HTMLResponse:
    body = (f"<!doctype html><html lang=en><meta charset=utf-8><meta name=referrer content=no-referrer>"
            f"<title>{html.escape(title)}</title><main><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>"
            f"</main></html>")
    return HTMLResponse(body, status_code=status, headers=_PAGE_HEADERS)


async def oauth_callback(request: Request) -> Response:
    """GET /oauth/callback?code&state[&iss] (or ?error&state): the end of a sign-in, in the person's browser."""
    ctx = context_of(request)
    query = request.query_params

    async def who() -> str | None:
        """The person of this browser's session (a sign-in binds its `state` to them), whatever world."""
        principal = await ctx.auth.authenticate(request)
        return principal.person if principal is not None else None
    try:
        _, server, failed = await ctx.engine.mcp_sign_ins.callback(
            query.get("state") or "", {k: query[k] for k in ("code", "iss", "error") if query.get(k)}, who)
    except AppError as exc:
        return _page("Sign-in not completed", exc.message, exc.status)
    if failed:
        return _page(f"Sign-in to {server} failed", redact_text(failed), 502)
    return _page(f"Signed in to {server}", f"The world's MCP server {server} is signed in. You can close this tab "
                                           "and go back to the world.", 200)


def routes() -> list[BaseRoute]:
    w = "/api/worlds/{world}/mcp/{server}/sign-in"
    return [
        Route(w, endpoint(start_sign_in), methods=["POST"]),
        Route(w, endpoint(sign_out), methods=["DELETE"]),
        Route(CALLBACK_PATH, oauth_callback, methods=["GET"]),
    ]
