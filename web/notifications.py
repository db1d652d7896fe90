"""The owner's notification forms on the settings view: webhooks, escalation, and the recent deliveries.

Each form changes the world's settings through `Engine.update_world`, the path `PATCH /api/worlds/{world}`
takes (the engine checks the role and the values); the page only turns form fields into settings and the
engine's messages into errors beside their fields. A webhook's URL and secret are write-only here as
everywhere (docs/notifications.md): the forms show `•••`, which keeps the stored value.
"""
from __future__ import annotations

import re
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server import vocab
from server.api.bodies import read_form
from server.api.context import context_of
from server.engine.engine import Engine
from server.errors import AppError
from server.webhooks.settings import FORMATS, MASK, SUBJECTS, hook_id, target_host

from .manage import _owner, _toasting
from .render import render

DELIVERIES_SHOWN = 20  # the newest webhook outcomes the view lists
_OUTCOMES = (vocab.WEBHOOK_DELIVERED, vocab.WEBHOOK_FAILED)
_HOOK_FIELD = re.compile(r"^webhooks\[\d+\]\.(\w+)")  # the field an engine's message names


def _hook_view(n: int, hook: dict[str, Any]) -> dict[str, Any]:
    """A stored webhook as the list shows it: its host (as its outcomes show it), never its URL or secret;
    its forms name it by its `id` (as the API's settings do), not by its place in a list that may change."""
    return {"n": n, "id": hook_id(hook), "host": target_host(str(hook.get("url") or "")),
            "format": hook.get("format", "json"), "events": list(hook.get("events") or SUBJECTS),
            "allow_private": bool(hook.get("allow_private")), "signed": bool(hook.get("secret")),
            "form": {"url": MASK, "secret": MASK if hook.get("secret") else "", "format": hook.get("format", "json"),
                     "events": list(hook.get("events") or SUBJECTS), "allow_private": bool(hook.get("allow_private"))}}


def _delivery_view(entry: dict[str, Any]) -> dict[str, Any]:
    ok = entry["action"] == vocab.WEBHOOK_DELIVERED
    detail = f"HTTP {entry['status']}" if ok and entry.get("status") else str(entry.get("error") or "")
    return {"ts": entry.get("ts"), "target": entry.get("target"), "subject": entry.get("subject"),
            "source_seq": entry.get("source_seq"), "ok": ok, "detail": detail, "attempts": entry.get("attempts")}


async def deliveries(engine: Engine, world: str) -> list[dict[str, Any]]:
    """The newest webhook outcomes, newest first, as the audit has them (`GET …/audit`)."""
    found = [e for e in await engine.audit(world, limit=500) if e["action"] in _OUTCOMES]  # oldest first
    return [_delivery_view(e) for e in reversed(found[-DELIVERIES_SHOWN:])]


async def context(engine: Engine, world: str) -> dict[str, Any]:
    """The notifications section's values: the escalation form, the webhooks, the recent deliveries."""
    settings = await engine.world_settings(world)
    after = settings.get("escalate_after")
    return {"escalation": {"escalate_after": "" if after is None else f"{after:g}",
                           "escalate_to": ", ".join(settings.get("escalate_to") or ())},
            "webhooks": [_hook_view(n, h) for n, h in enumerate(settings.get("webhooks") or ())],
            "deliveries": await deliveries(engine, world), "subjects": SUBJECTS, "formats": FORMATS}


def _hook_form(form: FormData) -> dict[str, Any]:
    """A webhook form's values, as typed (kept beside any error)."""
    def text(name: str) -> str:
        value = form.get(name)
        return value.strip() if isinstance(value, str) else ""
    return {"url": text("url"), "secret": text("secret"), "format": text("format") or "json",
            "events": [e for e in form.getlist("events") if isinstance(e, str)],
            "allow_private": form.get("allow_private") == "1"}


def _hook_from(values: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
    """The webhook a form describes; `•••` keeps the stored URL or secret (`stored`: the entry it edits)."""
    hook: dict[str, Any] = {"url": values["url"], "format": values["format"], "events": values["events"],
                            "allow_private": values["allow_private"]}
    if stored is not None and values["url"] == MASK:
        hook["url"] = stored["url"]
    if values["secret"]:
        hook["secret"] = stored.get("secret") if stored is not None and values["secret"] == MASK else values["secret"]
    return hook


def _index(request: Request, hooks: list[dict[str, Any]]) -> int:
    """Where in `hooks` the webhook the path's `{id}` names is: gone (removed or changed meanwhile, in
    another tab or through the API) is a refusal, never another webhook."""
    wanted = str(request.path_params["id"])
    found = next((n for n, hook in enumerate(hooks) if hook_id(hook) == wanted), None)
    if found is None:
        raise AppError(vocab.NOT_FOUND, "no such webhook (changed or removed meanwhile?): reload the page")
    return found


def _field(message: str) -> str:
    found = _HOOK_FIELD.match(message)
    return found.group(1) if found else ""


async def _answer(engine: Engine, world: str, **more: Any) -> Response:
    return HTMLResponse(render("_notifications.html", world_id=world, **(await context(engine, world) | more)))


@_toasting
async def save_webhook(request: Request) -> Response:
    """POST …/webhooks (a new one) or …/webhooks/{id} (the one with that id, edited): the list as it is now."""
    world, editing = request.path_params["world"], "id" in request.path_params
    actor = await _owner(request, world, "change the world")
    engine = context_of(request).engine
    values = _hook_form(await read_form(request))
    hooks = list((await engine.world_settings(world)).get("webhooks") or ())  # the stored values: never shown
    index = _index(request, hooks) if editing else len(hooks)
    errors = {"events": "tick at least one event"} if not values["events"] else {}
    try:
        if not errors:
            hook = _hook_from(values, hooks[index] if editing else None)
            changed = [*hooks[:index], hook, *hooks[index + 1:]]
            await engine.update_world(world, actor, settings={"webhooks": changed})
    except AppError as exc:
        errors = {_field(exc.message): exc.message}
    if errors:
        return await _answer(engine, world, **({"edit_n": index, "edit_values": values, "edit_errors": errors}
                                               if editing else {"add_values": values, "add_errors": errors}))
    return await _answer(engine, world, saved="webhooks")


@_toasting
async def remove_webhook(request: Request) -> Response:
    """POST …/webhooks/{id}/remove: the others keep their stored URLs and secrets."""
    world = request.path_params["world"]
    actor = await _owner(request, world, "change the world")
    engine = context_of(request).engine
    hooks = list((await engine.world_settings(world)).get("webhooks") or ())
    index = _index(request, hooks)
    await engine.update_world(world, actor, settings={"webhooks": hooks[:index] + hooks[index + 1:]})
    return await _answer(engine, world, saved="webhooks")


@_toasting
async def save_escalation(request: Request) -> Response:
    """POST …/escalation: `escalate_after` (minutes; empty: never) and `escalate_to` (names, comma separated)."""
    world = request.path_params["world"]
    actor = await _owner(request, world, "change the world")
    engine = context_of(request).engine
    form = await read_form(request)
    values = {k: v.strip() if isinstance(v := form.get(k), str) else "" for k in ("escalate_after", "escalate_to")}
    errors: dict[str, str] = {}
    after: float | None = None
    if values["escalate_after"]:
        try:
            after = float(values["escalate_after"])
        except ValueError:
            errors["escalate_after"] = "a number of minutes"
    names = [n.strip() for n in values["escalate_to"].split(",") if n.strip()]
    if not errors:
        try:
            await engine.update_world(world, actor, settings={"escalate_after": after, "escalate_to": names})
        except AppError as exc:
            errors["escalate_to" if "escalate_to" in exc.message else "escalate_after"] = exc.message
    if errors:
        return await _answer(engine, world, escalation=values, escalation_errors=errors)
    return await _answer(engine, world, saved="escalation")


@_toasting
async def recent_deliveries(request: Request) -> Response:
    """GET …/webhooks/deliveries: the deliveries table again (its Refresh button)."""
    world = request.path_params["world"]
    await _owner(request, world, "see the webhooks' deliveries")
    shown = await deliveries(context_of(request).engine, world)
    return HTMLResponse(render("_deliveries.html", world_id=world, deliveries=shown))
