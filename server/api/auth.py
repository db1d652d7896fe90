"""Who is calling (PROTOCOL §2): the owner token, invite tokens, and the signed session cookie."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Any
from urllib.parse import quote

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from .. import vocab
from ..engine.actors import Actor
from ..engine.engine import Engine
from ..errors import AppError
from ..log import Close, Conflict, Open, Tag
from .context import Principal, context_of
from .origin import origin_allowed

COOKIE = "aw_session"
COOKIE_MAX_AGE = 30 * 24 * 3600  # seconds a browser session lasts
OWNER_NAME = "owner"
INVITE_ROLES = (vocab.MEMBER, vocab.SPECTATOR)
_MEMBER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,39}$")
_RESERVED_NAMES = {OWNER_NAME, vocab.SERVER_SENDER}
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def invite_key(token_hash: str) -> str:
    """The open-item key of an invite: only the token's SHA-256 is ever stored."""
    return f"invite:{token_hash}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_member_name(name: object) -> str:
    """A valid invitee display name, or raise `invalid`."""
    if not isinstance(name, str) or not _MEMBER_NAME.match(name) or name.lower() in _RESERVED_NAMES:
        raise AppError(vocab.INVALID, "a member name has 1 to 40 letters, digits, spaces, '_', '.' or '-' "
                                      "and is not 'owner' or 'server'")
    return name


def _bearer(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


async def create_invite(engine: Engine, world: str, actor: Actor, role: object, name: object = None, *,
                        base_url: str = "") -> dict[str, Any]:
    """Store a new invite to `world` (only its token's SHA-256) and return {"url", "token", "role", "name", "id"}.

    Needs no owner token: the CLI calls this on a data folder or Redis URL directly.
    """
    actor.require(vocab.CAN_MANAGE, "invite people")
    if role not in INVITE_ROLES:
        raise AppError(vocab.INVALID, f"role must be one of {', '.join(INVITE_ROLES)}")
    if name is not None:
        name = check_member_name(name)
    await engine.worlds.get(world)  # not_found for an unknown world
    token = secrets.token_urlsafe(24)
    invite = {"id": vocab.new_id("invite")[:19], "role": role, "name": name}
    digest = token_hash(token)
    # The hash is kept in the event too, so the invite can be revoked by its id (clients never see it).
    await engine.store.append(
        world, {"kind": vocab.INVITE_CREATED, "invite": invite, "invite_id": invite["id"], "sender": actor.sender,
                "token_sha256": digest},
        [Open(invite_key(digest)), Tag(vocab.AUDIT_TAG)])
    url = f"{base_url.rstrip('/')}/login?world={quote(world, safe='')}&token={token}"
    return {"url": url, "token": token, "role": role, "name": name, "id": invite["id"]}


class TokenAuth:
    """The Authenticator of server/api/context.py, backed by the owner token and the worlds' logs."""

    def __init__(self, owner_token: str, engine: Engine) -> None:
        if not owner_token:
            raise ValueError("the owner token must not be empty")
        self._owner_token = owner_token
        self.engine = engine
        # Derived from the owner token, so cookies survive a restart with the same token (and die with it).
        key = hmac.new(owner_token.encode(), b"agent-world/session-cookie/v1", hashlib.sha256).hexdigest()
        self._cookies = URLSafeTimedSerializer(key, salt="aw-session")
        self._invite_worlds: dict[str, str] = {}  # token hash -> world: invites never move

    # -- tokens ----------------------------------------------------------------
    def is_owner_token(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self._owner_token.encode())

    async def _invite(self, world: str, digest: str) -> dict[str, Any] | None:
        event = await self.engine.store.log.get_open(world, invite_key(digest))
        return event["invite"] if event else None

    async def find_invite(self, token: str, world: str | None = None) -> tuple[str, dict[str, Any]] | None:
        """(world, invite) of a valid invite token; `world` is looked at first, then every world."""
        digest = token_hash(token)
        candidates = [w for w in (world, self._invite_worlds.get(digest)) if w]
        for candidate in dict.fromkeys(candidates):
            invite = await self._invite(candidate, digest)
            if invite is not None:
                self._invite_worlds[digest] = candidate
                return candidate, invite
        for candidate in await self.engine.store.log.worlds():
            if candidate in candidates:
                continue
            invite = await self._invite(candidate, digest)
            if invite is not None:
                self._invite_worlds[digest] = candidate
                return candidate, invite
        return None

    async def principal_for_token(self, token: str, world: str | None = None) -> Principal | None:
        if self.is_owner_token(token):
            return Principal(name=OWNER_NAME, owner=True)
        found = await self.find_invite(token, world)
        if found is None:
            return None
        invite_world, invite = found
        # A bearer client has no cookie to keep a chosen guest name in: derive a stable one from the token.
        name = invite.get("name") or f"guest-{token_hash(token)[-4:]}"
        return Principal(name=name, world=invite_world, role=invite["role"], invite=invite["id"])

    # -- the Authenticator protocol ------------------------------------------------
    async def authenticate(self, conn: HTTPConnection, world: str | None = None) -> Principal | None:
        token = _bearer(conn)
        if token is not None:
            return await self.principal_for_token(token, world)
        cookie = conn.cookies.get(COOKIE)
        if not cookie:
            return None
        principal = await self._from_cookie(cookie)
        if principal is not None and conn.scope["type"] == "http" and conn.scope.get("method") not in _SAFE_METHODS \
                and not origin_allowed(conn, context_of(conn).public_url):
            # SameSite=Lax still lets a page on another port of the same host post with our cookie.
            raise AppError(vocab.FORBIDDEN, "cross-origin request refused")
        return principal

    async def _from_cookie(self, cookie: str) -> Principal | None:
        try:
            data = self._cookies.loads(cookie, max_age=COOKIE_MAX_AGE)
        except BadSignature:
            return None
        if not isinstance(data, dict):
            return None
        if data.get("o") is True:
            return Principal(name=OWNER_NAME, owner=True)
        world, digest, name = data.get("w"), data.get("i"), data.get("n")
        if not (isinstance(world, str) and isinstance(digest, str) and isinstance(name, str)):
            return None
        invite = await self._invite(world, digest)  # the invite must still be open (revocable)
        if invite is None:
            return None
        return Principal(name=name, world=world, role=invite["role"], invite=invite["id"])

    def _invite_cookie(self, world: str, digest: str, name: str) -> str:
        return self._cookies.dumps({"w": world, "i": digest, "n": name})

    # -- invites -----------------------------------------------------------------
    async def create_invite(self, world: str, actor: Actor, role: object, name: object = None, *,
                            base_url: str = "") -> dict[str, Any]:
        """A new invite to `world`: {"url", "token", "role", "name", "id"}; the log keeps only the hash."""
        invite = await create_invite(self.engine, world, actor, role, name, base_url=base_url)
        self._invite_worlds[token_hash(invite["token"])] = world
        return invite

    async def list_invites(self, world: str, actor: Actor) -> list[dict[str, Any]]:
        """The invites to `world` that still work: id, role, name, when and by whom (never a token)."""
        actor.require(vocab.CAN_MANAGE, "list invites")
        await self.engine.worlds.get(world)
        return [{**event["invite"], "created": event["ts"], "by": event["sender"]}
                for event in await self.engine.store.log.list_open(world, "invite:")]

    async def revoke_invite(self, world: str, actor: Actor, invite_id: str) -> None:
        """End an invite: its token and every session cookie it gave stop working at once."""
        actor.require(vocab.CAN_MANAGE, "revoke invites")
        opened = [e for e in await self.engine.store.log.list_open(world, "invite:") if e["invite"]["id"] == invite_id]
        if not opened or not isinstance(opened[0].get("token_sha256"), str):
            # (invites made before they carried their token's hash cannot be revoked by id)
            raise AppError(vocab.NOT_FOUND, f"no revocable invite {invite_id!r} in this world")
        try:
            await self.engine.store.append(
                world, {"kind": vocab.INVITE_REVOKED, "invite_id": invite_id, "sender": actor.sender},
                [Close(invite_key(opened[0]["token_sha256"])), Tag(vocab.AUDIT_TAG)])
        except Conflict:
            raise AppError(vocab.NOT_FOUND, f"invite {invite_id!r} was already revoked") from None

    async def login_cookie(self, request: Request, token: str, world: str | None) -> tuple[str, str]:
        """(cookie value, where to go) for a login URL's token, or raise `forbidden`."""
        if self.is_owner_token(token):
            return self._cookies.dumps({"o": True, "n": OWNER_NAME}), f"/w/{quote(world, safe='')}" if world else "/"
        found = await self.find_invite(token, world)
        if found is None or (world is not None and found[0] != world):
            raise AppError(vocab.FORBIDDEN, "this login link is not valid (wrong, revoked or for another world)")
        invite_world, invite = found
        digest = token_hash(token)
        name = invite.get("name") or self._previous_guest_name(request, invite_world, digest) \
            or f"guest-{secrets.token_hex(2)}"
        return self._invite_cookie(invite_world, digest, name), f"/w/{quote(invite_world, safe='')}"

    def _previous_guest_name(self, request: Request, world: str, digest: str) -> str | None:
        """A guest opening the same invite link again keeps the name it was given."""
        try:
            data = self._cookies.loads(request.cookies.get(COOKIE, ""), max_age=COOKIE_MAX_AGE)
        except BadSignature:
            return None
        if isinstance(data, dict) and data.get("w") == world and data.get("i") == digest:
            return data.get("n") if isinstance(data.get("n"), str) else None
        return None


def _set_cookie(response: Response, request: Request, value: str) -> None:
    response.set_cookie(COOKIE, value, max_age=COOKIE_MAX_AGE, path="/", httponly=True, samesite="lax",
                        secure=request.url.scheme == "https")


async def login(request: Request) -> Response:
    """GET /login?token=T (owner) or ?world=W&token=T (invite): set the session cookie and go in."""
    auth = context_of(request).auth
    token = request.query_params.get("token", "")
    world = request.query_params.get("world") or None
    if not token or not isinstance(auth, TokenAuth):
        raise AppError(vocab.FORBIDDEN, "a login link carries ?token=")
    value, target = await auth.login_cookie(request, token, world)
    response = RedirectResponse(target, status_code=303)
    _set_cookie(response, request, value)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"  # the token is in this URL
    return response


async def logout(request: Request) -> Response:
    """POST /logout: forget the session cookie."""
    wants_html = "text/html" in request.headers.get("accept", "")
    response: Response = RedirectResponse("/", status_code=303) if wants_html else JSONResponse({"ok": True})
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="lax")
    return response
