"""The page's Edit (a person's own message) and Branch (from any message) forms: the engine's calls, with
their role checks. Regenerate is the Retry route (web/retry.py), which regenerates any reply."""
from __future__ import annotations

from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from server.api.context import context_of
from server.engine.actors import Actor
from server.engine.engine import BRANCH, EDIT

from .retry import as_sender, form_seq


async def edit(request: Request) -> Response:
    """POST /w/{world}/messages/{seq}/edit (content): 204, and the live page shows the new version."""
    world, seq = request.path_params["world"], request.path_params["seq"]

    async def act(actor: Actor, form: FormData) -> Response:
        await context_of(request).engine.edit_message(world, actor, form_seq(seq), form.get("content"))
        return Response(status_code=204)
    return await as_sender(request, EDIT, act)


async def branch(request: Request) -> Response:
    """POST /w/{world}/chats/{chat}/branch (seq): the page goes to the new chat; a toast if refused."""
    world, chat = request.path_params["world"], request.path_params["chat"]

    async def act(actor: Actor, form: FormData) -> Response:
        branched = await context_of(request).engine.branch_chat(world, actor, chat, form_seq(form.get("seq")))
        new = str(branched["chat"]["id"])
        return Response(status_code=204,
                        headers={"HX-Redirect": f"/w/{quote(world, safe='')}?chat={quote(new, safe='')}"})
    return await as_sender(request, BRANCH, act)
