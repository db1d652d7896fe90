"""Admitting and serving a live stream (stream.py), for the JSON WebSocket and the page's socket alike.

- Admission happens before the handshake completes, with an HTTP denial response (JSON error body):
  a foreign `Origin` → 403, no valid credentials → 401, no role in the world → 403, no such world → 404,
  `after` not a non-negative integer → 400. Clients without an `Origin` header (not browsers) are allowed.
- Every stream of the process is in one registry: the stall sweeper, the connection gauge, presence and
  the shutdown close cover both sockets.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from ... import vocab
from ...engine.actors import Actor
from ...errors import AppError
from ..auth.origin import origin_allowed
from ..auth.session_ends import session_ends
from ..context import AppContext, Principal, context_of
from .stream import Stream
from .transport import bound_send_buffer, stall_seconds

logger = logging.getLogger(__name__)

SWEEP_EVERY = 2.0  # how often blocked writes are looked at; one blocked longer than stall_seconds() is cut
_REGISTRY = "ws_connections"


class Registry:
    """The live streams of this process (both sockets), and a sweeper that drops the ones stuck behind a
    dead reader."""

    def __init__(self) -> None:
        self.connections: set[Stream] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, conn: Stream) -> None:
        self.connections.add(conn)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="ws-sweeper")

    def discard(self, conn: Stream) -> None:
        self.connections.discard(conn)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        stall = stall_seconds()
        while self.connections:
            await asyncio.sleep(min(SWEEP_EVERY, stall / 2))
            for conn in tuple(self.connections):
                since = conn.sending_since
                if since is not None and loop.time() - since > stall and not conn.closed:
                    logger.info("dropping a websocket of %s: its client stopped reading", conn.world)
                    # It has not read for `stall` seconds already: a short grace for the close frame.
                    conn.abort(1013, f"client stopped reading: reconnect with after={conn.last_seq}", grace=1.0)

    async def close_all(self, code: int, reason: str) -> None:
        await asyncio.gather(*(c.close(code, reason) for c in tuple(self.connections)), return_exceptions=True)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper


def registry_of(ctx: AppContext) -> Registry:
    registry = ctx.extra.get(_REGISTRY)
    if registry is None:
        registry = ctx.extra[_REGISTRY] = Registry()
    return registry


async def close_all(ctx: AppContext, code: int = 1012) -> None:
    """Close every live stream (at shutdown: 1012, so clients reconnect with `after=`)."""
    await registry_of(ctx).close_all(code, "server restarting: reconnect with after=")
    await session_ends(ctx).stop()


class DenialNoise(logging.Filter):
    """uvicorn's sans-I/O protocol logs an error after every HTTP denial response (it forgets that the
    denial completed the handshake); our endpoints always accept or deny, so that line is only noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing handshake."


def quiet_denials() -> None:
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, DenialNoise) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(DenialNoise())


# -- admission -------------------------------------------------------------------
@dataclass(frozen=True)
class Admission:
    principal: Principal
    actor: Actor
    after: int


def after_param(websocket: WebSocket) -> int:
    raw = websocket.query_params.get("after", "0")
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise AppError(vocab.INVALID, "after must be a non-negative integer (the last seq the client has)")
    return int(raw)


async def admit(websocket: WebSocket, ctx: AppContext, world: str) -> Admission:
    """Who connects and from where in the log, or the AppError to refuse the handshake with."""
    if not origin_allowed(websocket, ctx.public_url):
        raise AppError(vocab.FORBIDDEN, "cross-origin WebSocket refused")
    principal = await ctx.auth.authenticate(websocket, world)
    if principal is None:
        raise AppError("unauthorized", "authentication required: Authorization: Bearer <token> or a login link",
                       status=401)
    actor = principal.actor(world)  # forbidden before anything about the world is revealed
    if not await ctx.engine.worlds.exists(world):
        raise AppError(vocab.NOT_FOUND, f"no world {world!r}")
    return Admission(principal, actor, after_param(websocket))


async def deny(websocket: WebSocket, error: AppError) -> None:
    """Refuse the handshake with an HTTP status and a JSON body (a bare 403 where the server cannot)."""
    quiet_denials()
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(error.to_json(), status_code=error.status,
                                                          headers=error.headers))  # e.g. Retry-After
    else:
        await websocket.close(code=1008, reason=error.message[:120])


# -- serving ---------------------------------------------------------------------
async def serve(websocket: WebSocket, kind: type[Stream]) -> None:
    """Admit, then stream the world in the path to this socket as `kind` renders it, until it ends."""
    ctx = context_of(websocket)
    world = websocket.path_params["world"]
    try:
        admission = await admit(websocket, ctx, world)
    except AppError as exc:
        await deny(websocket, exc)
        return
    actor = admission.actor
    registry = registry_of(ctx)
    # Subscribe before reading the log: whatever is appended meanwhile waits in the subscription.
    async with ctx.engine.subscribe(world, maxsize=kind.queue_frames) as sub:
        await websocket.accept()
        bound_send_buffer(websocket)
        conn = kind(websocket, ctx, world, actor, sub, invite=admission.principal.invite,
                    invite_digest=admission.principal.invite_digest, session=admission.principal.session)
        registry.add(conn)
        ctx.metrics.connections.inc()
        ends, session = session_ends(ctx), admission.principal.session
        connection_id: str | None = None
        try:
            await ends.watch(conn, session)  # a logout closes it (in whichever process)
            connection_id = await ctx.presence.join(world, {"name": actor.name, "role": actor.role})
            await conn.run(admission.after)
        finally:
            registry.discard(conn)
            ends.unwatch(conn, session)
            ctx.metrics.connections.dec()
            if connection_id is not None:
                with contextlib.suppress(Exception):  # the bus may already be gone at shutdown
                    await ctx.presence.leave(world, connection_id)
