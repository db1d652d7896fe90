"""The owner's management forms on the world page: settings, MCP servers, agents, chats, invites.

Every form answers with its own fragment: errors beside their fields and the values kept, or the saved
state. The role checks are the engine's (ownership.py `require`, or the Worlds methods), never only the page's.
"""
from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server import vocab
from server.api.bodies import read_form
from server.api.context import context_of
from server.engine.actors import Actor
from server.errors import AppError
from server.tools.mcp.masking import MASK, masked_settings

from . import llm_check, views
from .render import render, role_context, toast

Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Response]])
SETTINGS_FIELDS = ("name", "turn_limit", "approval_timeout", "context_messages", "sandbox_network")
# The sandbox network modes as the form names them, and as the setting holds them (docs/protocol.md §10).
NETWORK_MODES: dict[str, bool | str] = {"off": False, "ask": "ask", "open": True}
MCP_FIELDS = ("name", "command", "args", "env", "url", "oauth", "oauth_issuer", "oauth_client_id",
              "oauth_client_secret", "trusted")
AGENT_FIELDS = ("name", "provider", "model", "base_url", "tools", "tools_mode", "system_prompt")
CHAT_FIELDS = ("title",)
RULE_FIELDS = ("tool", "argument", "glob", "effect")
# Which field an engine's message is about, by the words it names (first match wins).
_FIELD_WORDS = {"oauth.issuer": "oauth_issuer", "oauth.client_id": "oauth_client_id",
                "oauth.client_secret": "oauth_client_secret",
                "oauth.token_endpoint_auth_method": "oauth_client_secret", "turn_limit": "turn_limit",
                "approval_timeout": "approval_timeout", "context_messages": "context_messages",
                "a world needs a name": "name", "agent name": "name",
                "already exists": "name", "base_url": "base_url", "provider": "provider", "model": "model",
                "tools": "tools", "command": "command", "url": "url", "env": "env", "args": "args",
                "server name": "name", "mcp server": "name", "chat title": "title",
                "a rule needs": "tool", "rules and session grants": "tool", "glob": "glob"}


def _field_of(message: str, fields: tuple[str, ...]) -> str:
    lowered = message.lower()
    for words, field in _FIELD_WORDS.items():
        if words in lowered and field in fields:
            return field
    return ""


def _values(form: FormData, fields: tuple[str, ...]) -> dict[str, str]:
    return {f: (v.strip() if isinstance(v := form.get(f), str) else "") for f in fields}


async def _owner(request: Request, world: str, action: str) -> Actor:
    """The signed-in actor, refused (and audited, for members) unless the world's owner."""
    principal = await context_of(request).auth.authenticate(request, world)
    if principal is None:
        raise _NotSignedIn(vocab.FORBIDDEN, "sign in first")
    actor = principal.actor(world)
    await context_of(request).engine.require_to_manage(world, actor, action)
    return actor


class _NotSignedIn(AppError):
    """No session at all: refused before the body is read, with a plain 403."""


def _toasting(handler: Handler) -> Handler:
    """An htmx handler whose refusals (a role, a missing thing) become an error toast, the page left as it is."""
    @functools.wraps(handler)
    async def endpoint(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return await handler(request, *args, **kwargs)
        except _NotSignedIn:
            raise  # a stranger gets the plain 403 (a page, or JSON), not a toast on a page they do not have
        except AppError as exc:
            return HTMLResponse(toast(exc.message, "error"), headers={"HX-Reswap": "none"})
    return cast(Handler, endpoint)


# -- world settings ------------------------------------------------------------------------------------------
def settings_values(info: dict[str, Any]) -> dict[str, Any]:
    settings = info["settings"]
    network = next((mode for mode, value in NETWORK_MODES.items() if value == settings["sandbox_network"]
                    and type(value) is type(settings["sandbox_network"])), "off")
    return {"name": info["name"], "turn_limit": settings["turn_limit"],
            "approval_timeout": settings["approval_timeout"], "context_messages": settings["context_messages"],
            "sandbox_network": network}


def _number(values: dict[str, str], key: str, kind: type, errors: dict[str, str], optional: bool = False) -> Any:
    text = values[key]
    if not text and optional:
        return None
    try:
        return kind(text)
    except ValueError:
        errors[key] = "a whole number" if kind is int else "a number of seconds"
        return None


@_toasting
async def save_settings(request: Request) -> Response:
    world = request.path_params["world"]
    actor = await _owner(request, world, "change the world")
    values = _values(await read_form(request), SETTINGS_FIELDS)
    errors: dict[str, str] = {}
    settings = {"turn_limit": _number(values, "turn_limit", int, errors),
                "approval_timeout": _number(values, "approval_timeout", float, errors, optional=True),
                "context_messages": _number(values, "context_messages", int, errors)}
    if values["sandbox_network"]:  # a form without the field leaves the mode as it is
        if values["sandbox_network"] in NETWORK_MODES:
            settings["sandbox_network"] = NETWORK_MODES[values["sandbox_network"]]
        else:
            errors["sandbox_network"] = "off, ask or open"
    if not values["name"]:
        errors["name"] = "a world needs a name"
    if not errors:
        try:
            await context_of(request).engine.update_world(world, actor, values["name"], settings)
        except AppError as exc:
            errors[_field_of(exc.message, SETTINGS_FIELDS)] = exc.message
    if not values["sandbox_network"]:  # shown as stored: a form that lacked it must not read "off" next time
        stored = await context_of(request).engine.get_world(world)
        values["sandbox_network"] = settings_values(stored)["sandbox_network"]
    return HTMLResponse(render("_settings.html", world_id=world, values=values, errors=errors, saved=not errors))


# -- MCP servers -------------------------------------------------------------------------------------------
def _server_form(server: dict[str, Any]) -> dict[str, Any]:
    """A stored (masked) server as its edit form shows it: secrets stay •••, which keeps them when saved."""
    oauth = server.get("oauth")
    client: dict[str, Any] = oauth if isinstance(oauth, dict) else {}
    return {"command": server.get("command") or "", "args": "\n".join(server.get("args") or ()),
            "env": "\n".join(f"{k}={v}" for k, v in (server.get("env") or {}).items()),
            "url": server.get("url") or "", "oauth": bool(server.get("oauth")), "trusted": bool(server.get("trusted")),
            "oauth_issuer": client.get("issuer") or "", "oauth_client_id": client.get("client_id") or "",
            "oauth_client_secret": client.get("client_secret") or ""}


def mcp_context(info: dict[str, Any]) -> dict[str, Any]:
    status = info.get("mcp_status") or {}
    servers = []
    for server in info["settings"].get("mcp_servers") or ():
        state = views.mcp_state_view(status.get(server["name"]) or {}, server["name"])
        signed_in = (status.get(server["name"]) or {}).get("signed_in")
        servers.append(state | {"form": _server_form(server), "oauth": bool(server.get("oauth")),
                                "signed_in": bool(signed_in)})
    return {"mcp_servers": servers}


@_toasting
async def mcp_state(request: Request) -> Response:
    """GET …/mcp/{name}/state: one server's state line (the page asks again until it is up or failed)."""
    world, name = request.path_params["world"], request.path_params["name"]
    await _owner(request, world, "see MCP servers")
    found = [s for s in mcp_context(await context_of(request).engine.get_world(world))["mcp_servers"]
             if s["name"] == name]
    if not found:
        return HTMLResponse("")  # removed meanwhile
    return HTMLResponse(render("_mcp_state.html", world_id=world, s=found[0]))


def _server_from(values: dict[str, str], form: FormData, stored: dict[str, Any] | None) -> dict[str, Any]:
    """The server a form describes. `stored` (masked): its tool overrides and headers are kept as they were."""
    server: dict[str, Any] = {"name": values["name"], "trusted": form.get("trusted") == "1"}
    if values["url"]:
        server["url"] = values["url"]
        if form.get("oauth") == "1":
            server["oauth"] = _oauth_client(values, stored) or True
        if stored and stored.get("headers"):
            server["headers"] = stored["headers"]
    else:
        server["command"] = values["command"]
        server["args"] = [line.strip() for line in values["args"].splitlines() if line.strip()]
        env = {}
        for line in values["env"].splitlines():
            if line.strip():
                key, sep, value = line.strip().partition("=")
                if not sep:
                    raise AppError(vocab.INVALID, f"env: {key!r} needs a value (NAME=value)")
                env[key.strip()] = value
        server["env"] = env
    if stored and stored.get("tools"):
        server["tools"] = stored["tools"]
    return server


def _oauth_client(values: dict[str, str], stored: dict[str, Any] | None) -> dict[str, str] | None:
    """The registered OAuth client the form names (None: the server registers itself). Its secret as typed, or
    ••• for the stored one; how it is sent stays as stored (set through the API)."""
    if not values["oauth_client_id"]:
        if values["oauth_client_secret"] or values["oauth_issuer"]:
            raise AppError(vocab.INVALID, "oauth.client_id: give the client ID that goes with this issuer or secret")
        return None
    client = {"issuer": values["oauth_issuer"], "client_id": values["oauth_client_id"]}
    if values["oauth_client_secret"]:
        client["client_secret"] = values["oauth_client_secret"]
        before = (stored or {}).get("oauth")
        if isinstance(before, dict) and before.get("client_secret"):
            client["token_endpoint_auth_method"] = before.get("token_endpoint_auth_method") or "client_secret_basic"
    return client


@_toasting
async def _mcp_change(request: Request, name: str | None, remove: bool = False) -> Response:
    world = request.path_params["world"]
    engine = context_of(request).engine
    actor = await _owner(request, world, "change the world")
    form = await read_form(request)
    values = _values(form, MCP_FIELDS)
    if name is not None:
        values["name"] = name
    servers = masked_settings(await engine.world_settings(world)).get("mcp_servers") or []
    stored = next((s for s in servers if s["name"] == values["name"]), None)
    errors: dict[str, str] = {}
    try:
        if name is None and stored is not None:
            raise AppError(vocab.INVALID, f"an MCP server named {values['name']!r} already exists")
        if name is not None and stored is None:
            raise AppError(vocab.NOT_FOUND, f"no MCP server {name!r}")
        if remove:
            changed = [s for s in servers if s["name"] != name]
        else:
            server = _server_from(values, form, stored)
            changed = [server if s["name"] == values["name"] else s for s in servers] if stored else [*servers, server]
        await engine.update_world(world, actor, settings={"mcp_servers": changed})
    except AppError as exc:
        errors[_field_of(exc.message, MCP_FIELDS)] = exc.message
    context = mcp_context(await engine.get_world(world))
    # A secret typed in is never sent back, not even to the owner who typed it: a refused form shows the field
    # empty (a new secret is typed again, not replaced by the stored one unseen), ••• when that was sent.
    values["oauth_client_secret"] = MASK if values["oauth_client_secret"] == MASK else ""
    if errors and name is None:
        context.update(add_values=values, add_errors=errors)
    elif errors:
        context.update(edit_name=name, edit_values={**values, "trusted": form.get("trusted") == "1"},
                       edit_errors=errors)
    return HTMLResponse(render("_mcp.html", world_id=world, **context))


async def add_mcp(request: Request) -> Response:
    return await _mcp_change(request, None)


async def edit_mcp(request: Request) -> Response:
    return await _mcp_change(request, request.path_params["name"])


async def remove_mcp(request: Request) -> Response:
    return await _mcp_change(request, request.path_params["name"], remove=True)


# -- agents --------------------------------------------------------------------------------------------------
def agent_config(values: dict[str, str], edit: bool = False) -> dict[str, Any]:
    """The agent a form describes. Tools: `tools_mode` "all" (None), or "list": those named, none if empty.

    A form without the choice (an older page) names tools, or gets every tool when adding and keeps the
    agent's tools when editing: an edit never widens them unless "all" was chosen.
    """
    config: dict[str, Any] = {k: values[k] for k in ("name", "provider", "model", "system_prompt") if values[k]}
    config["base_url"] = values["base_url"] or None
    mode, names = values["tools_mode"], [t.strip() for t in values["tools"].split(",") if t.strip()]
    if mode not in ("", "all", "list"):
        raise AppError(vocab.INVALID, "tools: choose all tools or only those listed")
    if mode == "all":
        config["tools"] = None
    elif mode == "list" or names:
        config["tools"] = names
    elif not edit:
        config["tools"] = None
    return config


@_toasting
async def add_agent(request: Request) -> Response:
    world = request.path_params["world"]
    actor = await _owner(request, world, "add agents")
    values = _values(await read_form(request), AGENT_FIELDS)
    try:
        added = await context_of(request).engine.add_agent(world, actor, agent_config(values))
    except AppError as exc:
        errors = {_field_of(exc.message, AGENT_FIELDS): exc.message}
        return HTMLResponse(render("_agent_form.html", world_id=world, values=values, errors=errors))
    return HTMLResponse(render("_agent_form.html", world_id=world, values={}, added=added["name"]))


@_toasting
async def update_agent(request: Request) -> Response:
    """The agent's edit form: saved (the live fragment updates every page), or errors beside their fields."""
    world, name = request.path_params["world"], request.path_params["name"]
    actor = await _owner(request, world, "change agents")
    engine = context_of(request).engine
    await engine.agent(world, name)  # an unknown agent is a not-found toast: its name is never rendered
    values = {**_values(await read_form(request), AGENT_FIELDS), "name": name}
    errors: dict[str, str] = {}
    try:
        changes = {**agent_config(values, edit=True), "system_prompt": values["system_prompt"]}  # "" clears it
        agent = views.agent_view(await engine.update_agent(world, actor, name, changes))
    except AppError as exc:
        errors[_field_of(exc.message, AGENT_FIELDS)] = exc.message
        agent = values
    return HTMLResponse(render("_agent_config.html", agent=agent, errors=errors, world_id=world,
                               **role_context(actor.role)))


@_toasting
async def remove_agent(request: Request) -> Response:
    world, name = request.path_params["world"], request.path_params["name"]
    actor = await _owner(request, world, "remove agents")
    await context_of(request).engine.remove_agent(world, actor, name)
    return Response(status_code=204)  # the live fragment removes the agent from every page


async def _key_goes_to(request: Request, world: str, base_url: str | None) -> bool:
    """Whether the server's API key may go to `base_url`: the default endpoint, or one the world's agents use."""
    if llm_check.same_endpoint(None, base_url):
        return True
    return any(a.get("provider") == "openai" and llm_check.same_endpoint(a.get("base_url"), base_url)
               for a in await context_of(request).engine.worlds.agents(world))


@_toasting
async def models(request: Request) -> Response:
    """POST …/models (base_url, list): the endpoint's models as <option>s for the datalist `list`, out of band.

    A POST, so the page's Origin check applies. The server's API key goes only to the default endpoint and to
    those the world's agents use (the owner saved them); a typed URL is asked without it (the key is not
    the page's to send anywhere).
    """
    world = request.path_params["world"]
    await _owner(request, world, "list models")
    values = _values(await read_form(request), ("base_url", "list"))
    base_url = values["base_url"] or None
    with_key = await _key_goes_to(request, world, base_url)
    try:
        found = await llm_check.models(base_url, with_key)
    except Exception as exc:  # every failure is shown to the owner, worded with what to check
        return _said(llm_check.explain(exc, base_url, with_key), ok=False)
    return HTMLResponse(render("_models.html", target=values["list"] or "models-new", models=found,
                               keyless=not with_key))


@_toasting
async def test_agent(request: Request) -> Response:
    """One tiny call with the agent's model and endpoint: the reply, or what to fix."""
    world, name = request.path_params["world"], request.path_params["name"]
    await _owner(request, world, "test agents")
    agent = await context_of(request).engine.agent(world, name)
    if agent["provider"] != "openai":
        return _said("A scripted agent needs no endpoint.")
    try:
        reply = await llm_check.tiny_call(agent.get("base_url"), agent["model"])
    except Exception as exc:  # shown, worded with what to check
        return _said(llm_check.explain(exc, agent.get("base_url")), ok=False)
    return _said(f"{agent['model']} answered: {reply[:200] or '(nothing)'}")


# -- chats ---------------------------------------------------------------------------------------------------
@_toasting
async def rename_chat(request: Request) -> Response:
    """The chat's rename form: renamed (the live fragment renames it on every page), or the error beside the
    title (a chat deleted meanwhile: above it), the typed title kept."""
    world, chat = request.path_params["world"], request.path_params["chat"]
    principal = await context_of(request).auth.authenticate(request, world)
    if principal is None:
        raise _NotSignedIn(vocab.FORBIDDEN, "sign in first")
    engine = context_of(request).engine
    values = _values(await read_form(request), CHAT_FIELDS)
    errors: dict[str, str] = {}
    try:
        shown = await engine.chats.rename(world, principal.actor(world), chat, values["title"])
    except AppError as exc:
        if exc.code == vocab.FORBIDDEN:
            raise  # a role's refusal is a toast, as for every form here
        current = [c for c in await engine.worlds.chats(world) if c["id"] == chat]
        # Named, never by its id: the engine's words for a chat that is gone are for API clients.
        errors[_field_of(exc.message, CHAT_FIELDS)] = exc.message if current else "This chat was deleted."
        shown = current[0] if current else {"id": chat, "title": "deleted chat"}
    return HTMLResponse(render("_chat_edit.html", world_id=world, chat=shown, chat_errors=errors,
                               typed=values["title"]))


@_toasting
async def delete_chat(request: Request) -> Response:
    world, chat = request.path_params["world"], request.path_params["chat"]
    principal = await context_of(request).auth.authenticate(request, world)
    if principal is None:
        raise _NotSignedIn(vocab.FORBIDDEN, "sign in first")
    await context_of(request).engine.chats.delete(world, principal.actor(world), chat)
    return Response(status_code=204)


# -- rules ---------------------------------------------------------------------------------------------------
@_toasting
async def add_rule(request: Request) -> Response:
    """The settings view's rule form: added (the live rule_added fragment lists it on every owner's page), or
    errors beside their fields, the values kept."""
    world = request.path_params["world"]
    actor = await _owner(request, world, "add rules")
    values = _values(await read_form(request), RULE_FIELDS)
    errors: dict[str, str] = {}
    if values["glob"] and not values["argument"]:
        errors["argument"] = "a pattern needs the argument it matches"
    if not errors:
        match = {values["argument"]: values["glob"]} if values["argument"] else None
        try:
            await context_of(request).engine.add_rule(world, actor, values["tool"], match, values["effect"])
        except AppError as exc:
            errors[_field_of(exc.message, RULE_FIELDS)] = exc.message
    tools = sorted({t["name"] for t in (await context_of(request).engine.get_world(world))["tools"]})
    kept = values if errors else {"effect": values["effect"]}  # added: an empty form, the effect as chosen
    return HTMLResponse(render("_rule_form.html", world_id=world, values=kept, errors=errors, added=not errors,
                               tool_names=tools))


# -- invites -------------------------------------------------------------------------------------------------
async def invites(request: Request, world: str, actor: Actor) -> list[dict[str, Any]]:
    return await context_of(request).engine.list_invites(world, actor)


@_toasting
async def revoke_invite(request: Request) -> Response:
    world, item = request.path_params["world"], request.path_params["item"]
    actor = await _owner(request, world, "revoke invites")
    await context_of(request).engine.revoke_invite(world, actor, item)
    return HTMLResponse("")  # the row (the request's target) is replaced by nothing


def _said(text: str, ok: bool = True) -> Response:
    """A check's outcome, escaped: `ok` or an error worded with what to fix."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return HTMLResponse(f'<span class="{"ok" if ok else "field-error"}">{escaped}</span>')
