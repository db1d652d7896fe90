"""The JSON HTTP API (docs/protocol.md §5): every call authenticated, every role checked by the server."""
from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .. import vocab
from ..engine.actors import Actor
from ..engine.engine import BRANCH, EDIT
from ..engine.public import public, public_part
from ..engine.turns.retry_reply import RETRY
from ..errors import AppError
from .auth.tokens import TOO_MANY, logout
from .bodies import check_fields, json_body, optional_str, query_int
from .context import AppContext, Principal, context_of
from .find import export_chat, search
from .inbox import get_inbox

UNAUTHORIZED = "unauthorized"
MAX_PAGE = 1000  # events, audit lines per page
WORLDS_PAGE, MAX_WORLDS_PAGE = 100, 1000  # worlds per page of GET /api/worlds: by default, at most


@dataclass(frozen=True)
class Call:
    """One authenticated API call: who, where, and the shared context."""
    request: Request
    ctx: AppContext
    principal: Principal
    world: str | None

    @property
    def actor(self) -> Actor:
        """The caller acting in this call's world (its role there; `forbidden` when it has none)."""
        assert self.world is not None
        return self.principal.actor(self.world)

    def param(self, name: str) -> str:
        return str(self.request.path_params[name])


Handler = Callable[[Call], Awaitable[Any]]


def _unauthorized() -> Response:
    body = AppError(UNAUTHORIZED, "authentication required: Authorization: Bearer <token> or a login link",
                    status=401).to_json()
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": 'Bearer realm="agent-world"'})


def endpoint(handler: Handler, *, status: int = 200) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint around `handler`: authenticate, check the world, render the result as JSON.

    In a world, the order is: 401 (who are you?), 403 (no role here), 404 (no such world), then the
    handler, whose engine calls check the role for the action itself. A `None` result is 204.
    """
    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        ctx = context_of(request)
        world = request.path_params.get("world")
        principal = await ctx.auth.authenticate(request, world)
        if principal is None:
            return _unauthorized()
        call = Call(request, ctx, principal, world)
        if world is not None:
            call.actor  # noqa: B018 - raises forbidden before anything about the world is revealed
            if not await ctx.engine.world_exists(world):
                raise AppError(vocab.NOT_FOUND, f"no world {world!r}")
            if request.method not in ("GET", "HEAD") and not principal.owner:
                _check_flood(call)
        result = await handler(call)
        if isinstance(result, Response):
            return result
        if result is None:
            return Response(status_code=204)
        return JSONResponse(result, status_code=status)
    return run


def _check_flood(call: Call) -> None:
    """A member's or spectator's write in a world draws from the bucket their sockets there use (api/flood.py):
    429 beyond it. Not the owner's: its token is the server's own credential (scripts, imports and tests load
    worlds through it), and nothing a limit would protect is out of its reach."""
    assert call.world is not None
    wait = call.ctx.floods.retry_after(call.world, call.actor.identity)
    if wait:
        call.ctx.metrics.errors.labels("http_flood").inc()
        raise AppError(TOO_MANY, f"too many writes in this world: at most {call.ctx.floods.rate:g} a second "
                                 f"beyond a burst of {call.ctx.floods.burst:g}; try again in {wait} s",
                       status=429, headers={"Retry-After": str(wait)})


# -- who am I, worlds ------------------------------------------------------------
async def me(call: Call) -> dict[str, Any]:
    """GET /api/me[?world=W]: my name, whether I am the owner, my world and role."""
    p = call.principal
    out: dict[str, Any] = {"name": p.name, "owner": p.owner, "world": p.world, "role": p.role}
    if p.owner:
        out["role"] = vocab.OWNER
    asked = call.request.query_params.get("world")
    if asked:
        out["world"], out["role"] = asked, p.role_in(asked)
    return out


async def list_worlds(call: Call) -> Response:
    """GET /api/worlds[?limit=N&cursor=C]: a page of the worlds the caller has a role in, in id order; a
    `Link: <…>; rel="next"` header names the next page while there is one."""
    limit = query_int(call.request, "limit", WORLDS_PAGE, minimum=1, cap=MAX_WORLDS_PAGE)
    cursor = call.request.query_params.get("cursor", "")
    if cursor and not vocab.WORLD_ID.fullmatch(cursor):
        raise AppError(vocab.INVALID, "cursor must be one from the Link header of the previous page")
    if call.principal.owner:
        worlds, next_cursor = await call.ctx.engine.list_worlds(cursor, limit)
    else:  # a member or spectator has a role in one world at most: no list to read
        mine = call.principal.world
        worlds, next_cursor = [], None
        if mine and mine > cursor and await call.ctx.engine.world_exists(mine):
            worlds = [{"id": mine, "name": (await call.ctx.engine.world_info(mine))["name"]}]
    page = [{**w, "role": call.principal.role_in(w["id"])} for w in worlds]
    headers = {}
    if next_cursor is not None:
        headers["Link"] = f'</api/worlds?{urlencode({"limit": limit, "cursor": next_cursor})}>; rel="next"'
    return JSONResponse(page, headers=headers)


async def create_world(call: Call) -> dict[str, Any]:
    owner = call.principal.world_creator()  # before reading a body it would refuse anyway
    body = await json_body(call.request)
    check_fields(body, {"name", "settings", "agents"}, required=["name"])
    settings, agents = body.get("settings"), body.get("agents")
    if settings is not None and not isinstance(settings, dict):
        raise AppError(vocab.INVALID, "settings must be an object")
    if agents is not None and not isinstance(agents, list):
        raise AppError(vocab.INVALID, "agents must be a list of agent objects")
    return await call.ctx.engine.create_world(owner, body["name"], settings, agents)


async def get_world(call: Call) -> dict[str, Any]:
    info = await call.ctx.engine.get_world(call.world or "")
    info["members"] = call.ctx.presence.members(call.world or "")
    info["me"] = {"name": call.principal.name, "role": call.actor.role}
    return info


async def update_world(call: Call) -> dict[str, Any]:
    actor = call.actor
    body = await json_body(call.request)
    check_fields(body, {"name", "settings"})
    settings = body.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise AppError(vocab.INVALID, "settings must be an object")
    await call.ctx.engine.update_world(call.world or "", actor, name=body.get("name"), settings=settings)
    return await call.ctx.engine.get_world(call.world or "")


async def delete_world(call: Call) -> None:
    await call.ctx.engine.delete_world(call.world or "", call.actor)


# -- agents and chats ---------------------------------------------------------------
async def add_agent(call: Call) -> dict[str, Any]:
    actor = call.actor
    # Before reading a body it would refuse anyway; audited like every member's refusal.
    await call.ctx.engine.require_to_manage(call.world or "", actor, "add agents")
    return await call.ctx.engine.add_agent(call.world or "", actor, await json_body(call.request))


async def update_agent(call: Call) -> dict[str, Any]:
    actor = call.actor
    await call.ctx.engine.require_to_manage(call.world or "", actor, "change agents")
    return await call.ctx.engine.update_agent(call.world or "", actor, call.param("name"),
                                              await json_body(call.request))


async def remove_agent(call: Call) -> None:
    await call.ctx.engine.remove_agent(call.world or "", call.actor, call.param("name"))


async def cancel_agent(call: Call) -> dict[str, Any]:
    """Deny every pending approval of one agent."""
    engine, world, name = call.ctx.engine, call.world or "", call.param("name")
    return {"agent": name, "cancelled": await engine.cancel_approvals(world, call.actor, name)}


async def stop_agent(call: Call) -> dict[str, Any]:
    """Stop one agent's LLM call in flight; its turn ends with the partial text kept."""
    name = call.param("name")
    return {"agent": name, "stopped": await call.ctx.engine.cancel_turn(call.world or "", call.actor, name)}


async def retry_agent(call: Call) -> dict[str, Any]:
    """Have one agent answer again after its failed or stopped reply (`{"seq"}`): its `turn_retried` event."""
    actor, world = call.actor, call.world or ""
    await call.ctx.engine.require_to_send(world, actor, RETRY)  # before reading the body
    body = await json_body(call.request)
    check_fields(body, {"seq"}, required=["seq"])
    return public(await call.ctx.engine.retry(world, actor, call.param("name"), body["seq"]))


async def edit_message(call: Call) -> dict[str, Any]:
    """The sender's new version of their message at `{seq}` (`{"content"}`): its `message_edited` event."""
    actor, world = call.actor, call.world or ""
    await call.ctx.engine.require_to_send(world, actor, EDIT)  # before reading the body
    body = await json_body(call.request)
    check_fields(body, {"content"}, required=["content"])
    seq = call.param("seq")
    return public(await call.ctx.engine.edit_message(world, actor, int(seq) if seq.isdigit() else seq,
                                                     body["content"]))


async def branch_chat(call: Call) -> dict[str, Any]:
    """A new chat starting with the chat's messages up to `{"seq"}` (`"title"` optional): `chat_branched`."""
    actor, world = call.actor, call.world or ""
    await call.ctx.engine.require_to_send(world, actor, BRANCH)  # before reading the body
    body = await json_body(call.request)
    check_fields(body, {"seq", "title"}, required=["seq"])
    return public(await call.ctx.engine.branch_chat(world, actor, call.param("chat"), body["seq"],
                                                    body.get("title")))


async def list_chats(call: Call) -> list[dict[str, Any]]:
    return await call.ctx.engine.list_chats(call.world or "")


async def create_chat(call: Call) -> Any:
    actor = call.actor
    await call.ctx.engine.require_to_send(call.world or "", actor, "start chats")  # rename and delete: the owner's
    body = await json_body(call.request, optional=True)
    check_fields(body, {"title"})
    return public_part("chat", await call.ctx.engine.create_chat(call.world or "", actor,
                                                                 title=optional_str(body, "title")))


# -- messages, events, approvals ----------------------------------------------------
async def post_message(call: Call) -> dict[str, Any]:
    actor = call.actor
    await call.ctx.engine.require_to_send(call.world or "", actor)  # before reading the body
    body = await json_body(call.request)
    check_fields(body, {"content", "chat"}, required=["content"])
    # Every answer that carries an event or a part of one goes through `public`, as the stream does: the
    # stored event holds who really sent it (`person`) and what the stream hides.
    return public(await call.ctx.engine.post_message(call.world or "", actor, body["content"], body.get("chat")))


async def events(call: Call) -> list[dict[str, Any]]:
    """Persisted events with seq > after, in seq order, at most `limit` (default and cap 1000)."""
    after = query_int(call.request, "after", 0, minimum=0)
    limit = query_int(call.request, "limit", MAX_PAGE, minimum=1, cap=MAX_PAGE)
    return await call.ctx.engine.events(call.world or "", after, limit)


async def pending_approvals(call: Call) -> list[dict[str, Any]]:
    return await call.ctx.engine.pending_approvals(call.world or "")


async def pending_client_calls(call: Call) -> list[dict[str, Any]]:
    return await call.ctx.engine.pending_client_calls(call.world or "")


async def snapshot(call: Call) -> dict[str, Any]:
    """The WebSocket `snapshot` frame (docs/protocol.md §6), for clients that poll."""
    frame = await call.ctx.engine.snapshot(call.world or "")
    return {**frame, "members": call.ctx.presence.members(call.world or "")}


async def tool_result(call: Call) -> dict[str, Any]:
    actor = call.actor
    await call.ctx.engine.require_to_decide(call.world or "", actor)  # before reading the body
    body = await json_body(call.request)
    check_fields(body, {"role", "tool_call_id", "content", "name"}, required=["role", "tool_call_id", "content"])
    return public(await call.ctx.engine.submit_tool_result(call.world or "", actor, body))


async def decide_listed(call: Call) -> list[dict[str, Any]]:
    """One decision, once, on exactly the listed requests (docs/protocol.md §4: batches)."""
    actor = call.actor
    await call.ctx.engine.require_to_decide(call.world or "", actor)  # before reading the body
    body = await json_body(call.request)
    check_fields(body, {"ids", "decision", "scope", "reason"}, required=["ids", "decision"])
    content = {k: body[k] for k in ("decision", "scope", "reason") if k in body}
    return await call.ctx.engine.decide_listed(call.world or "", actor, body["ids"], content)


async def audit(call: Call) -> list[dict[str, Any]]:
    limit = query_int(call.request, "limit", MAX_PAGE, minimum=1, cap=MAX_PAGE)
    return await call.ctx.engine.audit(call.world or "", limit)


# -- rules, grants, invites -------------------------------------------------------------
async def list_rules(call: Call) -> list[dict[str, Any]]:
    return await call.ctx.engine.rules(call.world or "")


async def add_rule(call: Call) -> Any:
    actor = call.actor
    await call.ctx.engine.require_to_decide(call.world or "", actor)  # before reading the body
    body = await json_body(call.request)
    check_fields(body, {"tool", "match", "effect", "reason", "approvals_required"}, required=["tool", "effect"])
    match = body.get("match")
    if match is not None and not (isinstance(match, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in match.items())):
        raise AppError(vocab.INVALID, "match must map argument names to glob strings")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise AppError(vocab.INVALID, "reason must be a string")
    rule = await call.ctx.engine.add_rule(call.world or "", actor, body["tool"], match, body["effect"],
                                          reason=reason, approvals_required=body.get("approvals_required", 1))
    return public_part("rule", rule)  # as `GET /rules` lists it: a pattern may spell out a secret


async def revoke_rule(call: Call) -> None:
    await call.ctx.engine.revoke_rule(call.world or "", call.actor, call.param("id"))


async def list_grants(call: Call) -> list[dict[str, Any]]:
    chat = call.request.query_params.get("chat") or None
    return await call.ctx.engine.grants(call.world or "", chat)


async def revoke_grant(call: Call) -> None:
    await call.ctx.engine.revoke_grant(call.world or "", call.actor, call.param("id"))


async def create_invite(call: Call) -> dict[str, Any]:
    actor = call.actor
    await call.ctx.engine.require_to_manage(call.world or "", actor, "invite people")
    body = await json_body(call.request)
    check_fields(body, {"role", "name"}, required=["role"])
    return await call.ctx.engine.create_invite(call.world or "", actor, body["role"], body.get("name"),
                                               base_url=call.ctx.public_url)


async def list_invites(call: Call) -> list[dict[str, Any]]:
    return await call.ctx.engine.list_invites(call.world or "", call.actor)


async def revoke_invite(call: Call) -> None:
    await call.ctx.engine.revoke_invite(call.world or "", call.actor, call.param("id"))


def routes() -> list[BaseRoute]:
    w = "/api/worlds/{world}"
    return [
        Route("/api/me", endpoint(me), methods=["GET"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/inbox", endpoint(get_inbox), methods=["GET"]),
        Route("/api/worlds", endpoint(list_worlds), methods=["GET"]),
        Route("/api/worlds", endpoint(create_world, status=201), methods=["POST"]),
        Route(w, endpoint(get_world), methods=["GET"]),
        Route(w, endpoint(update_world), methods=["PATCH"]),
        Route(w, endpoint(delete_world), methods=["DELETE"]),
        Route(f"{w}/agents", endpoint(add_agent, status=201), methods=["POST"]),
        Route(f"{w}/agents/{{name}}", endpoint(update_agent), methods=["PATCH"]),
        Route(f"{w}/agents/{{name}}", endpoint(remove_agent), methods=["DELETE"]),
        Route(f"{w}/agents/{{name}}/cancel", endpoint(cancel_agent), methods=["POST"]),
        Route(f"{w}/agents/{{name}}/stop", endpoint(stop_agent), methods=["POST"]),
        Route(f"{w}/agents/{{name}}/retry", endpoint(retry_agent, status=201), methods=["POST"]),
        Route(f"{w}/chats", endpoint(list_chats), methods=["GET"]),
        Route(f"{w}/chats", endpoint(create_chat, status=201), methods=["POST"]),
        Route(f"{w}/chats/{{chat}}/export", endpoint(export_chat), methods=["GET"]),
        Route(f"{w}/search", endpoint(search), methods=["GET"]),
        Route(f"{w}/chats/{{chat}}/branch", endpoint(branch_chat, status=201), methods=["POST"]),
        Route(f"{w}/messages", endpoint(post_message, status=201), methods=["POST"]),
        Route(f"{w}/messages/{{seq}}/edit", endpoint(edit_message, status=201), methods=["POST"]),
        Route(f"{w}/events", endpoint(events), methods=["GET"]),
        Route(f"{w}/snapshot", endpoint(snapshot), methods=["GET"]),
        Route(f"{w}/approvals/pending", endpoint(pending_approvals), methods=["GET"]),
        Route(f"{w}/client-calls/pending", endpoint(pending_client_calls), methods=["GET"]),
        Route(f"{w}/tool-results", endpoint(tool_result, status=201), methods=["POST"]),
        Route(f"{w}/approvals/decide", endpoint(decide_listed), methods=["POST"]),
        Route(f"{w}/audit", endpoint(audit), methods=["GET"]),
        Route(f"{w}/rules", endpoint(list_rules), methods=["GET"]),
        Route(f"{w}/rules", endpoint(add_rule, status=201), methods=["POST"]),
        Route(f"{w}/rules/{{id}}", endpoint(revoke_rule), methods=["DELETE"]),
        Route(f"{w}/grants", endpoint(list_grants), methods=["GET"]),
        Route(f"{w}/grants/{{id}}", endpoint(revoke_grant), methods=["DELETE"]),
        Route(f"{w}/invites", endpoint(create_invite, status=201), methods=["POST"]),
        Route(f"{w}/invites", endpoint(list_invites), methods=["GET"]),
        Route(f"{w}/invites/{{id}}", endpoint(revoke_invite), methods=["DELETE"]),
    ]
