"""`GET`/`POST /api/push/subscriptions`, `DELETE …/{id}`: a person's devices (docs/protocol.md §5).

Subscriptions are the caller's own (`Principal.person`): the owner's, or one invite's (every session of an
invite is one person). Only people who may decide somewhere subscribe: a spectator's device would never
be told anything.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import urlsplit

from starlette.routing import BaseRoute, Route

from .. import vocab
from ..api.bodies import check_fields, json_body, optional_str
from ..api.http import Call, endpoint
from ..errors import AppError
from ..webhooks.targets import RefusedTarget, check_host
from .sender import ENDPOINT_HINT, Push
from .subscriptions import MAX_PER_PERSON, subscription_id

MAX_ENDPOINT = 2048  # characters of a push endpoint (browsers' are a few hundred)
PATH = "/api/push/subscriptions"


def push_of(call: Call) -> Push:
    push: Push = call.ctx.extra["push"]  # server/app.py starts it with the app
    return push


def _person(call: Call) -> str:
    p = call.principal
    if p.person is None or not (p.owner or p.role in vocab.CAN_DECIDE):
        raise AppError(vocab.FORBIDDEN, "only people who may decide get notifications")
    return p.person


def _key(keys: dict[str, Any], name: str, size: int) -> str:
    value = keys.get(name)
    try:
        raw = base64.urlsafe_b64decode(str(value) + "=" * (-len(str(value)) % 4)) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size or (name == "p256dh" and raw[:1] != b"\x04"):
        raise AppError(vocab.INVALID, f"keys.{name} must be the subscription's base64url {name} ({size} bytes)")
    return str(value)


def _record(body: dict[str, Any], allow_http: bool) -> dict[str, Any]:
    check_fields(body, ("endpoint", "keys", "expirationTime", "label"), ("endpoint", "keys"))
    endpoint_url, keys = body["endpoint"], body["keys"]
    schemes = ("https", "http") if allow_http else ("https",)
    if not isinstance(endpoint_url, str) or len(endpoint_url) > MAX_ENDPOINT \
            or urlsplit(endpoint_url).scheme not in schemes or not urlsplit(endpoint_url).hostname:
        raise AppError(vocab.INVALID, f"endpoint must be an https URL of at most {MAX_ENDPOINT} characters")
    if not isinstance(keys, dict) or set(keys) - {"p256dh", "auth"}:
        raise AppError(vocab.INVALID, 'keys must be {"p256dh", "auth"}, as PushSubscription.toJSON() gives them')
    return {"id": subscription_id(endpoint_url), "endpoint": endpoint_url,
            "keys": {"p256dh": _key(keys, "p256dh", 65), "auth": _key(keys, "auth", 16)},
            "label": optional_str(body, "label", 100) or "", "created": vocab.now_iso()}


def _public(record: dict[str, Any]) -> dict[str, Any]:
    """A subscription as its owner reads it back: never its keys."""
    return {k: record[k] for k in ("id", "endpoint", "label", "created")}


async def list_subscriptions(call: Call) -> dict[str, Any]:
    """GET: `{"key": <applicationServerKey>, "subscriptions": [...]}`, the caller's devices, oldest first."""
    person, push = _person(call), push_of(call)
    return {"key": push.key.public, "subscriptions": [_public(r) for r in await push.subscriptions.list(person)]}


async def add_subscription(call: Call) -> dict[str, Any]:
    """POST `PushSubscription.toJSON()` (and a `label`): this device is told of requests from now on."""
    person, push = _person(call), push_of(call)
    record = _record(await json_body(call.request), push.allow_http)
    if not push.allow_private:  # the server posts to it: never to its own or private addresses
        try:
            await check_host(urlsplit(record["endpoint"]).hostname or "", ENDPOINT_HINT)
        except RefusedTarget as exc:
            raise AppError(vocab.INVALID, f"endpoint: {exc}") from None
    mine = await push.subscriptions.list(person)
    if len(mine) >= MAX_PER_PERSON and record["id"] not in {r["id"] for r in mine}:
        raise AppError(vocab.INVALID, f"at most {MAX_PER_PERSON} devices per person: remove one first")
    await push.subscriptions.put(person, record)
    return _public(record)


async def remove_subscription(call: Call) -> None:
    """DELETE one of the caller's devices."""
    person, push = _person(call), push_of(call)
    if not await push.subscriptions.delete(person, call.param("id")):
        raise AppError(vocab.NOT_FOUND, "no such subscription of yours")


def routes() -> list[BaseRoute]:
    return [
        Route(PATH, endpoint(list_subscriptions), methods=["GET"]),
        Route(PATH, endpoint(add_subscription, status=201), methods=["POST"]),
        Route(f"{PATH}/{{id}}", endpoint(remove_subscription), methods=["DELETE"]),
    ]
