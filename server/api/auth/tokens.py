"""Who is calling (docs/protocol.md §2): the owner token, invite tokens, and server-side browser sessions."""
from __future__ import annotations

import asyncio
import hmac
from typing import Any
from urllib.parse import quote

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from ... import vocab
from ...aio import cancel_and_wait
from ...engine.engine import Engine
from ...engine.world.invites import OWNER_NAME, member_name, token_hash
from ...errors import AppError
from ..bodies import read_form
from ..context import Principal, context_of
from .origin import origin_allowed, own_origin
from .ratelimit import FailureLimiter
from .session_ends import announce_end
from .sessions import MAX_AGE as COOKIE_MAX_AGE
from .sessions import Sessions

COOKIE = "aw_session"
SECURE_COOKIE = "__Host-aw_session"  # behind https: Secure, host-only, Path=/ (the browser enforces it)
MIN_OWNER_TOKEN = 32  # characters
TOO_MANY = "too_many_requests"
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def _bearer(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def cookie_name(public_url: str) -> str:
    return SECURE_COOKIE if public_url.lower().startswith("https://") else COOKIE


def _client_address(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client else "unknown"


class TokenAuth:
    """The Authenticator of server/api/context.py: the owner token, invite tokens, and sessions."""

    def __init__(self, owner_token: str, engine: Engine, sessions: Sessions, public_url: str) -> None:
        if len(owner_token) < MIN_OWNER_TOKEN:
            raise ValueError(f"the owner token must have at least {MIN_OWNER_TOKEN} characters")
        self._owner_token = owner_token
        self.engine = engine
        self.sessions = sessions
        self.public_url = public_url
        self.cookie = cookie_name(public_url)
        self.failures = FailureLimiter()
        # A session of the owner names the token it came from: another owner token ends it.
        self._owner_print = sessions.fingerprint(owner_token)
        # token hash -> world, for tokens made before tokens named their world
        self._legacy_invites: asyncio.Task[dict[str, str]] | None = None

    async def start(self) -> None:
        """Index the invites made before tokens named their world: every world is read once, in the
        background (a start with 100,000 worlds waited 4.5 s for it: #30), and never at a request's
        asking (an unknown token made the server read every world)."""
        self._legacy_invites = asyncio.create_task(self.engine.invite_hashes(), name="legacy-invites")

    async def stop(self) -> None:
        if self._legacy_invites is not None:
            await cancel_and_wait(self._legacy_invites)

    async def _legacy_world(self, digest: str) -> str | None:
        """The world of a token made before tokens named theirs (waiting for the index while it is read)."""
        task = self._legacy_invites
        if task is None:
            return None
        try:
            invites = await asyncio.shield(task)
        except Exception:  # the storage failed the read: refused now, read again in the background
            if self._legacy_invites is task:
                self._legacy_invites = asyncio.create_task(self.engine.invite_hashes(), name="legacy-invites")
            return None
        return invites.get(digest)

    # -- tokens ----------------------------------------------------------------
    def is_owner_token(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self._owner_token.encode())

    async def _invite(self, world: str, digest: str) -> dict[str, Any] | None:
        return await self.engine.find_invite(world, digest)

    async def find_invite(self, token: str, world: str | None = None) -> tuple[str, dict[str, Any]] | None:
        """(world, invite) of a valid invite token: the world it names (or `world`), one index read each."""
        digest = token_hash(token)
        named = token.rpartition(".")[0]
        legacy = None if named else await self._legacy_world(digest)  # tokens have named their world since
        for candidate in dict.fromkeys(w for w in (named, world, legacy) if w):
            invite = await self._invite(candidate, digest)
            if invite is not None:
                return candidate, invite
        return None

    def _check_rate(self, conn: HTTPConnection) -> None:
        wait = self.failures.retry_after(_client_address(conn))
        if wait:
            raise AppError(TOO_MANY, f"too many wrong tokens from this address: try again in {wait} s",
                           status=429, headers={"Retry-After": str(wait)})

    async def _check_token(self, conn: HTTPConnection, token: str, world: str | None,
                           again: bool = False) -> tuple[str, dict[str, Any]] | None:
        """("", {}) for the owner token, (world, invite) for a valid invite token, else None.

        Every miss counts against the caller's address; past the limit it gets 429, even with a good token.
        Neither with `again`, the token an open socket signed in with: that is no guess, and others' misses
        from the same address (behind one proxy) must not close the socket.
        """
        if not again:
            self._check_rate(conn)
        if self.is_owner_token(token):
            return "", {}
        found = await self.find_invite(token, world) if len(token) <= 300 else None
        if found is None and not again:
            self.failures.failed(_client_address(conn))
        return found

    async def principal_for_token(self, conn: HTTPConnection, token: str,
                                  world: str | None = None, again: bool = False) -> Principal | None:
        found = await self._check_token(conn, token, world, again)
        if found is None:
            return None
        invite_world, invite = found
        if not invite_world:
            return Principal(name=OWNER_NAME, owner=True)
        return Principal(name=member_name(invite), world=invite_world, role=invite["role"], invite=invite["id"],
                         invite_digest=token_hash(token))

    # -- the Authenticator protocol ------------------------------------------------
    async def authenticate(self, conn: HTTPConnection, world: str | None = None, *,
                           again: bool = False) -> Principal | None:
        token = _bearer(conn)
        if token is not None:
            return await self.principal_for_token(conn, token, world, again)
        session_id = conn.cookies.get(self.cookie)
        if not session_id:
            return None
        principal = await self._from_session(conn, session_id)
        if principal is not None and conn.scope["type"] == "http" and conn.scope.get("method") not in _SAFE_METHODS \
                and not origin_allowed(conn, self.public_url):
            # Cookies are not port-scoped: a page on another port of this host would send ours along.
            raise AppError(vocab.FORBIDDEN, "cross-origin request refused")
        return principal

    async def _from_session(self, conn: HTTPConnection, session_id: str) -> Principal | None:
        record = await self.sessions.resolve(session_id)
        if record is None or record.get("origin") != own_origin(conn):
            return None  # unknown, ended, expired, or issued by this server under another origin
        if record.get("owner") is True:
            return Principal(name=OWNER_NAME, owner=True, session=self.sessions.key(session_id)) \
                if record.get("token") == self._owner_print else None
        world, digest = record.get("world"), record.get("invite")
        if not (isinstance(world, str) and isinstance(digest, str)):
            return None
        invite = await self._invite(world, digest)  # the invite must still be open (revocable)
        if invite is None:
            return None
        # The name comes from the invite, not the session: every session of one invite shows the same.
        return Principal(name=member_name(invite), world=world, role=invite["role"], invite=invite["id"],
                         invite_digest=digest, session=self.sessions.key(session_id))

    # -- logging in --------------------------------------------------------------
    async def describe_login(self, conn: HTTPConnection, token: str, world: str | None) -> dict[str, Any]:
        """Whom a login link's token signs in as: {"owner", "world", "role", "name", "target"}, or `forbidden`."""
        found = await self._check_token(conn, token, world) if token else None
        if found is None or (world is not None and found[0] and found[0] != world):
            raise AppError(vocab.FORBIDDEN, "this login link is not valid (wrong, revoked or for another world)")
        invite_world, invite = found
        if not invite_world:
            target = f"/w/{quote(world, safe='')}" if world else "/"
            return {"owner": True, "world": world, "role": vocab.OWNER, "name": OWNER_NAME, "target": target}
        return {"owner": False, "world": invite_world, "role": invite["role"], "name": member_name(invite),
                "target": f"/w/{quote(invite_world, safe='')}"}

    async def start_session(self, request: Request, token: str, world: str | None) -> tuple[str, str]:
        """(new session id, where to go) for a login link's token; the request's previous session ends."""
        login = await self.describe_login(request, token, world)
        previous = request.cookies.get(self.cookie, "")
        record: dict[str, Any] = {"origin": own_origin(request)}
        if login["owner"]:
            record |= {"owner": True, "token": self._owner_print}
        else:
            record |= {"world": login["world"], "invite": token_hash(token)}  # its name: the invite's
        session_id = await self.sessions.issue(record)
        if previous:
            await self._end(previous)
        return session_id, login["target"]

    async def end_session(self, request: Request) -> None:
        session_id = request.cookies.get(self.cookie)
        if session_id:
            await self._end(session_id)

    async def _end(self, session_id: str) -> None:
        """End a session, and its open sockets in every process (server/api/auth/session_ends.py)."""
        await self.sessions.end(session_id)
        if session_id and len(session_id) <= 100:
            await announce_end(self.engine.store.bus, self.sessions.key(session_id))


def _token_auth(conn: HTTPConnection) -> TokenAuth:
    auth = context_of(conn).auth
    if not isinstance(auth, TokenAuth):
        raise AppError(vocab.FORBIDDEN, "this server's access control has no login links")
    return auth


def _no_store(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"  # a login URL carries its token
    return response


MAX_LOGIN_FORM = 4096  # bytes: a token and a world id


async def login(request: Request) -> Response:
    """POST /login (form or JSON-free: token, world?): start a session and go in.

    A GET of a login link only shows whom it signs in as (web/pages.py), so a foreign page cannot
    switch a visitor's session: this POST must come from our own origin (a browser always says).
    """
    auth = _token_auth(request)
    if not origin_allowed(request, auth.public_url):
        raise AppError(vocab.FORBIDDEN, "cross-origin login refused")
    form = await read_form(request, MAX_LOGIN_FORM)
    token, world = form.get("token") or "", form.get("world") or None
    if not isinstance(token, str) or not token or (world is not None and not isinstance(world, str)):
        raise AppError(vocab.FORBIDDEN, "a login carries the token of a login link")
    session_id, target = await auth.start_session(request, token, world)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(auth.cookie, session_id, max_age=COOKIE_MAX_AGE, path="/", httponly=True,
                        samesite="lax", secure=auth.cookie == SECURE_COOKIE or request.url.scheme == "https")
    return _no_store(response)


async def logout(request: Request) -> Response:
    """POST /logout: end the session on the server and forget its cookie."""
    auth = _token_auth(request)
    if not origin_allowed(request, auth.public_url):
        raise AppError(vocab.FORBIDDEN, "cross-origin logout refused")
    await auth.end_session(request)
    wants_html = "text/html" in request.headers.get("accept", "")
    response: Response = RedirectResponse("/", status_code=303) if wants_html else JSONResponse({"ok": True})
    response.delete_cookie(auth.cookie, path="/", httponly=True, samesite="lax",
                           secure=auth.cookie == SECURE_COOKIE)
    return response
