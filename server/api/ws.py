"""The JSON WebSocket of docs/protocol.md §6: `GET /api/worlds/{world}/ws?after=SEQ`.

- Admission happens before the handshake completes, with an HTTP denial response (JSON error body):
  a foreign `Origin` → 403, no valid credentials → 401, no role in the world → 403, no such world → 404,
  `after` not a non-negative integer → 400. Clients without an `Origin` header (not browsers) are allowed.
- The connection subscribes to the world's bus channel first, then replays the log after `after`, then
  sends a `snapshot`, then live frames: no gap, no duplicate (see ws_conn.py).
- `say`, `tool_result` and `resync` frames get an `ack` when they carry a `ref` (say/tool_result: the
  resulting event's `seq` and `id`; resync: `last_seq`); refusals and malformed frames get an `error`
  frame (`code`, `message`, `ref`) and the connection stays open. `resync` without `after` sends a snapshot;
  with `after`, the events after it first. The ack of a say may arrive before its event frame.
- Closing codes: 1008 for a flood (more than 20 frames a second beyond a burst of 60) or 50 malformed
  frames in a row; 1013 for a client that fell QUEUE_FRAMES behind or left a write blocked for
  `stall_seconds()` (reconnect with `after=`: the close is made at the transport, see transport.py, so a
  client that does not read cannot keep its socket); 1012 when the server shuts down; 1000 after a
  `world_deleted` event. `resync` is charged against a byte budget (ws_conn.py). Keepalive pings come from uvicorn
  (`ws_ping_interval=20` in server/cli.py): a client that stops answering them is dropped.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from .. import vocab
from ..engine.actors import Actor
from ..engine.store import channel
from ..errors import AppError
from .context import AppContext, Principal, context_of
from .origin import origin_allowed
from .transport import bound_send_buffer, stall_seconds
from .ws_conn import Connection

log = logging.getLogger(__name__)

# A connection's bound: frames waiting to be written before it is cut off (1013); AGENT_WORLD_WS_QUEUE_FRAMES.
QUEUE_FRAMES = max(10, int(os.environ.get("AGENT_WORLD_WS_QUEUE_FRAMES") or 1000))
SWEEP_EVERY = 2.0  # how often blocked writes are looked at; one blocked longer than stall_seconds() is cut
_REGISTRY = "ws_connections"


class Registry:
    """The live connections of this process, and a sweeper that drops the ones stuck behind a dead reader."""

    def __init__(self) -> None:
        self.connections: set[Connection] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, conn: Connection) -> None:
        self.connections.add(conn)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="ws-sweeper")

    def discard(self, conn: Connection) -> None:
        self.connections.discard(conn)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        stall = stall_seconds()
        while self.connections:
            await asyncio.sleep(min(SWEEP_EVERY, stall / 2))
            for conn in tuple(self.connections):
                since = conn.sending_since
                if since is not None and loop.time() - since > stall and not conn.closed:
                    log.info("dropping a websocket of %s: its client stopped reading", conn.world)
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
    """Close every live connection (at shutdown: 1012, so clients reconnect with `after=`)."""
    await registry_of(ctx).close_all(code, "server restarting: reconnect with after=")


class _DenialNoise(logging.Filter):
    """uvicorn's sans-I/O protocol logs an error after every HTTP denial response (it forgets that the
    denial completed the handshake); our endpoint always accepts or denies, so that line is only noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing handshake."


def routes() -> list[BaseRoute]:
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DenialNoise) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_DenialNoise())
    return [WebSocketRoute("/api/worlds/{world}/ws", world_socket)]


# -- admission -------------------------------------------------------------------
def _after_param(websocket: WebSocket) -> int:
    raw = websocket.query_params.get("after", "0")
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise AppError(vocab.INVALID, "after must be a non-negative integer (the last seq the client has)")
    return int(raw)


async def _admit(websocket: WebSocket, ctx: AppContext, world: str) -> tuple[Principal, Actor, int]:
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
    return principal, actor, _after_param(websocket)


async def _deny(websocket: WebSocket, error: AppError) -> None:
    """Refuse the handshake with an HTTP status and a JSON body (a bare 403 where the server cannot)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(error.to_json(), status_code=error.status,
                                                          headers=error.headers))  # e.g. Retry-After
    else:
        await websocket.close(code=1008, reason=error.message[:120])


# -- the endpoint ----------------------------------------------------------------
async def world_socket(websocket: WebSocket) -> None:
    ctx = context_of(websocket)
    world = websocket.path_params["world"]
    try:
        principal, actor, after = await _admit(websocket, ctx, world)
    except AppError as exc:
        await _deny(websocket, exc)
        return
    registry = registry_of(ctx)
    # Subscribe before reading the log: whatever is appended meanwhile waits in the subscription.
    async with ctx.engine.store.bus.subscribe(channel(world), maxsize=QUEUE_FRAMES) as sub:
        await websocket.accept()
        bound_send_buffer(websocket)
        conn = Connection(websocket, ctx, world, actor, sub, invite=principal.invite)
        registry.add(conn)
        ctx.metrics.connections.inc()
        connection_id: str | None = None
        try:
            connection_id = await ctx.presence.join(world, {"name": actor.name, "role": actor.role})
            await conn.run(after)
        finally:
            registry.discard(conn)
            ctx.metrics.connections.dec()
            if connection_id is not None:
                with contextlib.suppress(Exception):  # the bus may already be gone at shutdown
                    await ctx.presence.leave(world, connection_id)
