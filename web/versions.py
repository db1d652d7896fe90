"""The page's Edit (a person's own message) and Branch (from any message) forms: the engine's calls, with
their role checks. Regenerate is the Retry route (web/retry.py), which regenerates any reply."""
from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server import vocab
from server.api.bodies import read_form
from server.api.context import context_of
from server.engine.engine import BRANCH, EDIT
from server.errors import AppError

from .render import toast


def _seq(value: object) -> object:
    text = str(value or "")
    return int(text) if text.isdigit() else text


async def edit(request: Request) -> Response:
    """POST /w/{world}/messages/{seq}/edit (content): 204, and the live page shows the new version."""
    world, seq = request.path_params["world"], request.path_params["seq"]
    ctx = context_of(request)
    try:
        principal = await ctx.auth.authenticate(request, world)
        if principal is None:
            raise AppError(vocab.FORBIDDEN, "sign in first")
        actor = principal.actor(world)
        await ctx.engine.require_to_send(world, actor, EDIT)  # before reading the form
        content = (await read_form(request)).get("content")
        await ctx.engine.edit_message(world, actor, _seq(seq), content)
    except AppError as exc:
        return HTMLResponse(toast(exc.message, "error"), headers={"HX-Reswap": "none"})
    return Response(status_code=204)


async def branch(request: Request) -> Response:
    """POST /w/{world}/chats/{chat}/branch (seq): the page goes to the new chat; a toast if refused."""
    world, chat = request.path_params["world"], request.path_params["chat"]
    ctx = context_of(request)
    try:
        principal = await ctx.auth.authenticate(request, world)
        if principal is None:
            raise AppError(vocab.FORBIDDEN, "sign in first")
        actor = principal.actor(world)
        await ctx.engine.require_to_send(world, actor, BRANCH)  # before reading the form
        seq = (await read_form(request)).get("seq")
        branched = await ctx.engine.branch_chat(world, actor, chat, _seq(seq))
    except AppError as exc:
        return HTMLResponse(toast(exc.message, "error"), headers={"HX-Reswap": "none"})
    new = str(branched["chat"]["id"])
    return Response(status_code=204,
                    headers={"HX-Redirect": f"/w/{quote(world, safe='')}?chat={quote(new, safe='')}"})
