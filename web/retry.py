"""The page's Retry button on a failed or stopped reply (any reply: a regeneration), and what the page's
message actions share (`as_sender`): the engine's calls, with their role checks."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server import vocab
from server.api.bodies import read_form
from server.api.context import context_of
from server.engine.actors import Actor
from server.engine.turns.retry_reply import RETRY
from server.errors import AppError

from .render import toast


def form_seq(value: object) -> object:
    """A seq from a form field: an int when it is one (the engine says what is wrong with anything else)."""
    text = str(value or "")
    return int(text) if text.isdigit() else text


async def as_sender(request: Request, action: str, act: Callable[[Actor, FormData], Awaitable[Response]]) -> Response:
    """`act` for a signed-in person who may send in the world (checked before the form is read); a refusal
    as a toast, the page left as it is."""
    world = request.path_params["world"]
    ctx = context_of(request)
    try:
        principal = await ctx.auth.authenticate(request, world)
        if principal is None:
            raise AppError(vocab.FORBIDDEN, "sign in first")
        actor = principal.actor(world)
        await ctx.engine.require_to_send(world, actor, action)
        return await act(actor, await read_form(request))
    except AppError as exc:
        return HTMLResponse(toast(exc.message, "error"), headers={"HX-Reswap": "none"})


async def retry(request: Request) -> Response:
    """POST /w/{world}/agents/{name}/retry (seq): 204, and the live page shows the new turn; a toast if refused."""
    world, name = request.path_params["world"], request.path_params["name"]

    async def act(actor: Actor, form: FormData) -> Response:
        await context_of(request).engine.retry(world, actor, name, form_seq(form.get("seq")))
        return Response(status_code=204)
    return await as_sender(request, RETRY, act)
