"""The pages: the world list, a world, its audit trail, and the owner's small forms (all via the engine)."""
from __future__ import annotations

import contextlib
import functools
from typing import Any
from urllib.parse import quote, urlencode

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from server import offload, vocab
from server.api.auth.tokens import TokenAuth
from server.api.bodies import read_form
from server.api.context import AppContext, Principal, context_of
from server.engine.actors import Actor
from server.errors import AppError
from server.tools.egress.hosts import PACKAGE_REGISTRIES, network_mode

from . import llm_check, manage, markdown, notifications, views
from .elicitations import question_view
from .render import render, role_context, toast

WINDOW = 3000  # how far back in the log the first render of a conversation looks
MAX_ITEMS = 400  # conversation items on a first render
EVENTS_ON_LOOP = 50  # events of a history made on the event loop (with at most markdown.LOOP_MARKDOWN characters)
WORLDS_PAGE = 100  # worlds listed on one page of the world list (a "more" link leads on)


async def _principal(request: Request, world: str | None = None) -> Principal | None:
    return await context_of(request).auth.authenticate(request, world)


def _signin(message: str = "You are not signed in.") -> Response:
    return HTMLResponse(render("signin.html", message=message), status_code=401)


def _actor(principal: Principal | None, world: str) -> Actor:
    if principal is None:
        raise AppError(vocab.FORBIDDEN, "sign in first")
    return principal.actor(world)


def _back(world: str, chat: str | None = None) -> Response:
    url = f"/w/{quote(world, safe='')}" + (f"?chat={quote(chat, safe='')}" if chat else "")
    return RedirectResponse(url, status_code=303)


def _hx_error(exc: AppError) -> Response:
    """A refused htmx form: a toast, swapped into the page's toast area."""
    return HTMLResponse(toast(exc.message, "error"), headers={"HX-Reswap": "none"})


async def world_list(request: Request) -> Response:
    principal = await _principal(request)
    if principal is None:
        return _signin()
    ctx = context_of(request)
    if not principal.owner and principal.world:
        return RedirectResponse(f"/w/{quote(principal.world, safe='')}", status_code=303)
    cursor = request.query_params.get("cursor", "")
    if cursor and not vocab.WORLD_ID.fullmatch(cursor):
        raise AppError(vocab.INVALID, "cursor must be one from the page's \u201cmore\u201d link")
    worlds, next_cursor = await ctx.engine.list_worlds(cursor, WORLDS_PAGE)
    more = f"/?{urlencode({'cursor': next_cursor})}" if next_cursor is not None else None
    counts = await ctx.engine.pending_counts()  # the inbox's worlds (the work index), not every world's queue
    return HTMLResponse(render("worlds.html", worlds=worlds, more=more, paged=bool(cursor), me=principal.name,
                               counts=counts, total=sum(counts.values()), **role_context(vocab.OWNER)))


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


async def create_world(request: Request) -> Response:
    principal = await _principal(request)
    if principal is None:
        raise AppError(vocab.FORBIDDEN, "only the owner creates worlds")
    actor = principal.world_creator()  # before a byte of the body is read
    form = await read_form(request)
    settings: dict[str, Any] = {}
    if timeout := _text(form, "approval_timeout"):
        try:
            settings["approval_timeout"] = float(timeout)
        except ValueError:
            raise AppError(vocab.INVALID, "approval timeout must be a number of seconds") from None
    world = await context_of(request).engine.create_world(actor, _text(form, "name"), settings or None)
    return _back(world["id"])


async def create_chat(request: Request) -> Response:
    world = request.path_params["world"]
    actor = _actor(await _principal(request, world), world)
    title = _text(await read_form(request), "title") or None
    chat = await context_of(request).engine.create_chat(world, actor, title=title)
    return _back(world, chat["id"])


async def _revoke(request: Request, kind: str) -> Response:
    world, item = request.path_params["world"], request.path_params["item"]
    engine = context_of(request).engine
    try:
        actor = _actor(await _principal(request, world), world)
        if kind == "rule":
            await engine.revoke_rule(world, actor, item)
        else:
            await engine.revoke_grant(world, actor, item)
    except AppError as exc:
        return _hx_error(exc)
    return Response(status_code=204)  # the live fragment removes the row from every owner's page


async def revoke_rule(request: Request) -> Response:
    return await _revoke(request, "rule")


async def revoke_grant(request: Request) -> Response:
    return await _revoke(request, "grant")


async def invite(request: Request) -> Response:
    world = request.path_params["world"]
    ctx = context_of(request)
    try:
        actor = _actor(await _principal(request, world), world)
        await ctx.engine.require_to_manage(world, actor, "invite people")  # before a byte of the body is read
        form = await read_form(request)
        made = await ctx.engine.create_invite(world, actor, _text(form, "role"), _text(form, "name") or None,
                                              base_url=ctx.public_url)
    except AppError as exc:
        return HTMLResponse(f'<p class="error">{_escape(exc.message)}</p>')
    listed = await manage.invites(request, world, actor)  # the list beside the form, out of band
    return HTMLResponse(render("_invite.html", invite=made)
                        + render("_invites.html", invites=listed, world_id=world, oob=True))


async def login_page(request: Request) -> Response:
    """GET /login?token=…[&world=…]: whom this link signs in as, and a button that POSTs the login.

    Opening the link changes nothing: a foreign page linking here cannot switch the visitor's session.
    """
    auth = context_of(request).auth
    if not isinstance(auth, TokenAuth):
        raise AppError(vocab.FORBIDDEN, "this server's access control has no login links")
    token = request.query_params.get("token", "")
    world = request.query_params.get("world") or None
    login = await auth.describe_login(request, token, world)
    world_name = None
    if login["world"]:
        with contextlib.suppress(AppError):
            world_name = (await context_of(request).engine.world_info(login["world"]))["name"]
    response = HTMLResponse(render("login.html", login=login, world_name=world_name, token=token, world=world))
    response.headers["Cache-Control"] = "no-store"
    # This URL carries a token: no Referer to other sites. (Not no-referrer: Chrome would then send
    # `Origin: null` with the form's POST, and the same-origin check would refuse it.)
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def audit(request: Request) -> Response:
    world = request.path_params["world"]
    principal = await _principal(request, world)
    if principal is None:
        return _signin()
    principal.actor(world)
    engine = context_of(request).engine
    info = await engine.world_info(world)
    entries = []
    for entry in await engine.audit(world):
        base = {k: entry.get(k) for k in ("seq", "ts", "who", "agent", "action")}
        base["details"] = {k: v for k, v in entry.items() if k not in base and v is not None and k != "chat"}
        entries.append(base)
    return HTMLResponse(render("audit.html", world=info, entries=entries))


async def _conversation(ctx: AppContext, world: str, chat: str, last_seq: int) -> tuple[list[dict[str, Any]], bool]:
    """The chat's items up to `last_seq` (the newest MAX_ITEMS within the last WINDOW events)."""
    start = max(0, last_seq - WINDOW)
    shown: list[vocab.Event] = []
    after = start
    while after < last_seq:
        events = await ctx.engine.events(world, after, 1000)
        if not events:
            break
        shown += [event for event in events if event["seq"] <= last_seq and event.get("chat") == chat]
        after = events[-1]["seq"]
    # Markdown holds the GIL (about 1.5 ms a kilobyte): a history of long messages (a member's 100,000
    # characters each, a 1 MB reply: 2 s) rendered on the loop held every world. Only a short one is made
    # here; others in a worker process (behind heavy work past offload.HEAVY characters).
    size = sum(map(offload.size, shown))
    if size > markdown.LOOP_MARKDOWN or len(shown) > EVENTS_ON_LOOP:
        items = await offload.run(functools.partial(views.conversation_items, shown), light=size <= offload.HEAVY)
    else:
        items = views.conversation_items(shown)
    return items[-MAX_ITEMS:], start > 0 or len(items) > MAX_ITEMS


async def world_page(request: Request) -> Response:
    world = request.path_params["world"]
    principal = await _principal(request, world)
    if principal is None:
        return _signin()
    role = principal.actor(world).role
    ctx = context_of(request)
    engine = ctx.engine
    # The seq first: anything newer than what is read below is replayed by the socket (every swap is idempotent).
    last_seq = await engine.last_seq(world)
    info = await engine.get_world(world)
    chats = info["chats"]
    chat = next((c for c in chats if c["id"] == request.query_params.get("chat")), chats[-1] if chats else None)
    if chat is None:
        raise AppError(vocab.NOT_FOUND, f"world {world!r} has no chat")
    items, truncated = await _conversation(ctx, world, chat["id"], last_seq)
    context = {
        "world": info, "world_id": world, "chat": chat, "chat_id": chat["id"], "chats": chats,
        "me": principal.name, "last_seq": last_seq, "seq": last_seq, "items": items, "truncated": truncated,
        "agents": [views.agent_view(a) for a in info["agents"]],
        "statuses": {a["name"]: views.status_view(info["status"][a["name"]]) for a in info["agents"]},
        "approvals": [views.approval_view(p["message"], p.get("approved_by"), p.get("may_decide"))
                      for p in await engine.pending_approvals(world)],
        "client_calls": [views.client_call_view(c["id"], c["name"], c["arguments"], c["agent"])
                         for c in await engine.pending_client_calls(world)],
        "questions": [question_view(q) for q in await engine.pending_questions(world)],
        "members": ctx.presence.members(world),
    }
    response = HTMLResponse(render("world.html", **role_context(role), **context))
    response.headers["Cache-Control"] = "no-store"  # a back/forward visit must re-render, not show a stale seq
    return response


async def settings_page(request: Request) -> Response:
    """GET /w/{world}/settings: the owner's administration (agents' configuration, the world's settings, MCP
    servers, rules and grants, invites), live over the same page socket; anyone else is refused (403)."""
    world = request.path_params["world"]
    principal = await _principal(request, world)
    if principal is None:
        return _signin()
    actor = principal.actor(world)
    engine = context_of(request).engine
    await engine.require_to_manage(world, actor, "open the world's settings")  # audited, as every refusal here
    last_seq = await engine.last_seq(world)  # first: anything newer is replayed by the socket
    info = await engine.get_world(world)
    context = {
        "world": info, "world_id": world, "me": principal.name, "last_seq": last_seq, "seq": last_seq,
        "agents": [views.agent_view(a) for a in info["agents"]],
        "lacking_key": llm_check.lacking_key(info["agents"]),
        "values": manage.settings_values(info), "errors": {}, **manage.mcp_context(info),
        **await notifications.context(engine, world),
        "rules": [views.rule_view(rule) for rule in await engine.rules(world)],
        "grants": [views.grant_view(grant) for grant in await engine.grants(world)],
        "tool_names": sorted({t["name"] for t in info["tools"]}),
        "package_registries": PACKAGE_REGISTRIES,  # what the network defaults offer (_network_defaults.html)
        "network_mode": network_mode(info["settings"].get("sandbox_network")),
        "invites": await manage.invites(request, world, actor),
    }
    response = HTMLResponse(render("settings.html", **role_context(actor.role), **context))
    response.headers["Cache-Control"] = "no-store"  # as the world page: a back/forward visit re-renders
    return response
