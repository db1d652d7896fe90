"""A browser session that ends (logout, a new login from the same browser) closes its open sockets (a
world's, the page's and the JSON one, and the inbox's) in every process: sessions are shared across
processes, so the end is said on the bus (`SESSIONS_CHANNEL`, the session's keyed digest, never its id)
and each process closes its own.

Each process listens from its first session socket on. A socket is checked again once the listener is
subscribed (an end said before that is not missed) and after the bus lost messages (a gap).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from starlette.websockets import WebSocket

from ...bus import Bus, Gap, Overflow
from ..context import AppContext

logger = logging.getLogger(__name__)

SESSIONS_CHANNEL = "agent-world:sessions-ended"
CLOSE_CODE = 1008  # on purpose, not for a retry: the page asks /api/me and says the session ended
CLOSE_REASON = "session ended: open your link again"
_KEY = "session_ends"


async def announce_end(bus: Bus, session_key: str) -> None:
    """Tell every process that the session with this key ended. When the bus cannot carry it, this
    process's own sockets of the session are closed all the same (closing one twice is harmless), the
    others are told of a gap once the bus works again (they check every socket's session then), and the
    error is raised."""
    try:
        await bus.publish(SESSIONS_CHANNEL, session_key)
    except Exception:
        bus.deliver_here(SESSIONS_CHANNEL, session_key)
        bus.missed(SESSIONS_CHANNEL)
        raise


class SessionSocket(Protocol):
    """A socket a session holds open: a world's stream (live/stream.py) or the inbox's (web/inbox.py)."""

    @property
    def websocket(self) -> WebSocket: ...

    @property
    def world(self) -> str | None:
        """The world it was admitted to (None: none in particular), to authenticate it again."""

    def seal(self) -> None:
        """Write nothing more but the close: called in the turn that learns the session ended."""

    async def close(self, code: int, reason: str = "") -> None: ...


class SessionEnds:
    """This process's session sockets by session key, and the listener that closes them."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.sockets: dict[str, set[SessionSocket]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening: asyncio.Future[None] | None = None

    async def watch(self, conn: SessionSocket, session_key: str | None) -> None:
        """Close `conn` when its session ends (nothing for a bearer token's socket)."""
        if session_key is None:
            return
        self.sockets.setdefault(session_key, set()).add(conn)
        if self._task is None or self._task.done():
            self._listening = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._listen(self._listening), name="session-ends")
        assert self._listening is not None
        await asyncio.shield(self._listening)
        await self._recheck([conn])  # ended between its admission and our subscription

    def unwatch(self, conn: SessionSocket, session_key: str | None) -> None:
        conns = self.sockets.get(session_key or "")
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del self.sockets[session_key or ""]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _seal(self, key: str) -> None:
        """As the bus hands over a session's end, before what it hands over next (news read from the same
        socket, after the end, which the stream's writer may take before this listener's turn comes): the
        session's sockets write nothing more but their close."""
        for conn in self.sockets.get(key, ()):
            conn.seal()

    async def _close(self, conns: list[SessionSocket]) -> None:
        """Close `conns`, each sealed already: at the end's delivery (`_seal`), or as a recheck found it."""
        await asyncio.gather(*(c.close(CLOSE_CODE, CLOSE_REASON) for c in conns), return_exceptions=True)

    async def _recheck(self, conns: list[SessionSocket]) -> None:
        """Close those whose session no longer signs anyone in."""
        ended = []
        for conn in conns:
            try:
                if await self.ctx.auth.authenticate(conn.websocket, conn.world, again=True) is None:
                    conn.seal()  # now, not once every socket is checked
                    ended.append(conn)
            except Exception:  # e.g. the storage is down: the socket's own stream meets that too
                logger.debug("could not check a socket's session", exc_info=True)
        await self._close(ended)

    async def _listen(self, listening: asyncio.Future[None]) -> None:
        while True:
            try:
                async with self.ctx.engine.store.bus.subscribe(SESSIONS_CHANNEL, maxsize=10_000,
                                                               at_delivery=self._seal) as sub:
                    if not listening.done():
                        listening.set_result(None)
                    while True:
                        try:
                            key = await sub.get()
                        except Gap as gap:
                            if not gap.down:  # back: an end may have been said meanwhile
                                await self._recheck([c for conns in self.sockets.values() for c in conns])
                            continue
                        await self._close(list(self.sockets.get(key, ())))
            except asyncio.CancelledError:
                raise
            except Overflow:
                logger.warning("session ends fell behind the bus; listening again")
                await self._recheck([c for conns in self.sockets.values() for c in conns])
            except Exception as exc:  # e.g. Redis is down: the bus reconnects, and so do we
                logger.warning("listening for session ends failed (%s); retrying in 1 s", exc)
                if not listening.done():
                    listening.set_result(None)
                await asyncio.sleep(1.0)


def session_ends(ctx: AppContext) -> SessionEnds:
    ends = ctx.extra.get(_KEY)
    if ends is None:
        ends = ctx.extra[_KEY] = SessionEnds(ctx)
    return ends
