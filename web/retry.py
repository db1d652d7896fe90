"""The page's Retry button on a failed or stopped reply: the engine's `retry`, with its role check."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server import vocab
from server.api.bodies import read_form
from server.api.context import context_of
from server.engine.turns.retry_reply import RETRY
from server.errors import AppError

from .render import toast


async def retry(request: Request) -> Response:
    """POST /w/{world}/agents/{name}/retry (seq): 204, and the live page shows the new turn; a toast if refused."""
    world, name = request.path_params["world"], request.path_params["name"]
    ctx = context_of(request)
    try:
        principal = await ctx.auth.authenticate(request, world)
        if principal is None:
            raise AppError(vocab.FORBIDDEN, "sign in first")
        actor = principal.actor(world)
        await ctx.engine.require_to_send(world, actor, RETRY)  # before reading the form
        seq = str((await read_form(request)).get("seq") or "")
        await ctx.engine.retry(world, actor, name, int(seq) if seq.isdigit() else seq)
    except AppError as exc:
        return HTMLResponse(toast(exc.message, "error"), headers={"HX-Reswap": "none"})
    return Response(status_code=204)
