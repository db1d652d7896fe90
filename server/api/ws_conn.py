"""One JSON WebSocket connection: a writer task (replay, snapshot, live frames) and a reader task (client frames).

Ordering: the writer and the replies to client frames share one lock, so every frame is written whole and
the stream of events a connection sends is gapless and duplicate-free: `last_seq` is the last event sent;
a live event at or below it is dropped, one past `last_seq + 1` is preceded by the missing ones from the log.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import vocab
from ..bus import Gap, Overflow, Subscription
from ..engine.actors import Actor
from ..engine.store import frame_text
from ..errors import AppError
from ..log.failures import is_storage_error
from .context import AppContext
from .transport import close_at_transport
from .ws_frames import (
    EVENT_PREFIX,
    BadFrame,
    ByteBudget,
    ClientFrame,
    TokenBucket,
    ack_text,
    error_text,
    event_info,
    is_world_deleted,
    parse_client_frame,
    revokes_invite,
)

log = logging.getLogger(__name__)

PAGE = 500  # events per log read while replaying
RATE, BURST = 20.0, 60.0  # client frames: 20 a second sustained, bursts of 60; beyond: closed with 1008
MAX_BAD_IN_A_ROW = 50  # malformed frames in a row before the connection is closed with 1008
CLOSE_TIMEOUT = 5.0  # how long a close frame may wait behind a client that does not read
# What resyncs may make us send: 1 MB a second on average, 8 MB at once (a whole log replay is charged).
REPLAY_RATE, REPLAY_BURST = 1_000_000.0, 8_000_000.0
UNAVAILABLE = "storage_unavailable"  # the code of error frames (and HTTP 503 bodies) saying the storage is down
STORAGE_DOWN = "storage unavailable, retrying"
STORAGE_LOST = "the storage lost this world's events"


class _WorldGone(Exception):
    """The world was deleted: after forwarding that event the connection ends."""


class _Revoked(Exception):
    """The invite this connection came in with was revoked: after forwarding that event it ends."""


class Connection:
    def __init__(self, websocket: WebSocket, ctx: AppContext, world: str, actor: Actor, sub: Subscription,
                 invite: str | None = None) -> None:
        self.websocket, self.ctx, self.world, self.actor, self.sub = websocket, ctx, world, actor, sub
        self.invite = invite
        self.last_seq = 0
        self.sending_since: float | None = None  # loop time a blocked send began (for the stall sweeper)
        self.closed = False
        self._lock = asyncio.Lock()
        self._bucket = TokenBucket(RATE, BURST)
        self._bad_in_a_row = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._sent = 0  # characters written so far
        self._replay_budget = ByteBudget(REPLAY_RATE, REPLAY_BURST)

    # -- lifecycle -------------------------------------------------------------
    async def run(self, after: int) -> None:
        """Serve until the client leaves, misbehaves or is closed by the server."""
        writer = asyncio.create_task(self._write(after), name=f"ws-writer-{self.world}")
        reader = asyncio.create_task(self._read(), name=f"ws-reader-{self.world}")
        self._tasks = [writer, reader]
        try:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def abort(self, code: int = 1013, reason: str = "", grace: float | None = None) -> None:
        """End this connection now (a client that does not read): its close frame goes behind what is
        buffered, and its transport is aborted after `grace` seconds, so its descriptor is released."""
        self.closed = True
        close_at_transport(self.websocket, code, reason or f"client too slow: reconnect with after={self.last_seq}",
                           grace)
        for task in self._tasks:
            task.cancel()

    async def close(self, code: int, reason: str = "") -> None:
        """Send a close frame after any frame being written; at the transport for a client that does not read."""
        if self.closed:
            return
        self.closed = True
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                async with self._lock:
                    await self.websocket.close(code, reason[:120])
        except (TimeoutError, WebSocketDisconnect, RuntimeError, OSError):
            self.abort(code, reason)

    # -- writing ---------------------------------------------------------------
    async def _send(self, text: str) -> None:
        """Write one frame (the caller holds the lock)."""
        if self.closed:
            raise WebSocketDisconnect(1000)
        self._sent += len(text)
        self.sending_since = asyncio.get_running_loop().time()
        try:
            await self.websocket.send_text(text)
        finally:
            self.sending_since = None

    async def _write(self, after: int) -> None:
        try:
            async with self._lock:
                # Clamp: a client that claims more than exists must not make us drop the events to come.
                self.last_seq = min(after, await self.ctx.engine.store.log.last_seq(self.world))
                await self._replay()
                await self._send_snapshot()
            while True:
                if self.sub.overflowed:  # cut off by the bus: don't drain a backlog the client can't take
                    raise Overflow(self.sub.channel)
                try:
                    text: str | None = await self.sub.get()
                    async with self._lock:
                        # Drain what is already queued in one go: one wake-up per burst, not one per frame.
                        while text is not None:
                            await self._forward(text)
                            if self.sub.overflowed:  # fell behind while we were writing: stop at the bound
                                raise Overflow(self.sub.channel)
                            text = self.sub.get_nowait()
                except Gap as gap:
                    async with self._lock:
                        await self._after_gap(gap)
        except Overflow:
            self.ctx.metrics.errors.labels("ws_overflow").inc()
            self.abort(1013, f"client too slow: reconnect with after={self.last_seq}")
        except _WorldGone:
            await self.close(1000, "world deleted")
        except _Revoked:
            await self.close(1008, "invite revoked")
        except (WebSocketDisconnect, OSError):
            pass  # the client went away
        except AppError as exc:  # e.g. the world was deleted while replaying
            await self.close(1011, exc.message)
        except Exception as exc:
            if is_storage_error(exc):  # the client comes back and resumes once the storage answers
                log.warning("websocket of %s closed: storage failed (%s: %s)", self.world, type(exc).__name__, exc)
                await self.close(1013, f"{STORAGE_DOWN}: reconnect with after={self.last_seq}")
                return
            log.exception("websocket writer failed in %s", self.world)
            await self.close(1011, "internal error")

    async def _forward(self, text: str) -> None:
        """A live frame: events once each and in order, everything else as it comes."""
        if not text.startswith(EVENT_PREFIX):
            await self._send(text)
            return
        seq, kind = event_info(text)
        if seq <= self.last_seq:
            return
        if seq > self.last_seq + 1:
            await self._replay(until=seq - 1)
        await self._send(text)  # the bus's own text: never re-serialized per connection
        self.last_seq = seq
        if is_world_deleted(kind):
            raise _WorldGone()
        if kind == vocab.INVITE_REVOKED and revokes_invite(json.loads(text)["event"], self.invite):
            raise _Revoked()

    async def _after_gap(self, gap: Gap) -> None:
        """The bus lost its connection: say so; once it is back, send what it missed from the log."""
        if gap.down:
            await self._send(error_text(UNAVAILABLE, STORAGE_DOWN))
            return
        if await self.ctx.engine.store.log.last_seq(self.world) < self.last_seq:
            await self.close(1011, STORAGE_LOST)  # e.g. Redis restarted without persistence
            raise WebSocketDisconnect(1011)
        await self._replay()
        await self._send_snapshot()

    async def _replay(self, until: int | None = None) -> None:
        """Send the logged events after `last_seq` (up to `until`, or to the end of the log)."""
        while until is None or self.last_seq < until:
            limit = PAGE if until is None else min(PAGE, until - self.last_seq)
            events = await self.ctx.engine.events(self.world, self.last_seq, limit)
            for event in events:
                await self._send(frame_text({"type": "event", "event": event}))
                self.last_seq = event["seq"]
            if len(events) < limit:
                return

    async def _send_snapshot(self) -> None:
        snapshot = await self.ctx.engine.snapshot(self.world)
        await self._replay(until=snapshot["last_seq"])  # every event the snapshot reflects comes before it
        snapshot["members"] = self.ctx.presence.members(self.world)
        await self._send(frame_text(snapshot))

    async def _reply(self, text: str) -> None:
        async with self._lock:
            await self._send(text)

    # -- reading ---------------------------------------------------------------
    async def _read(self) -> None:
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if not self._bucket.take():
                    self.ctx.metrics.errors.labels("ws_flood").inc()
                    await self.close(1008, f"too many frames: at most {RATE:g} a second")
                    return
                try:
                    frame = parse_client_frame(dict(message))
                except BadFrame as exc:
                    self.ctx.metrics.errors.labels("ws_bad_frame").inc()
                    self._bad_in_a_row += 1
                    if self._bad_in_a_row >= MAX_BAD_IN_A_ROW:
                        await self.close(1008, f"{MAX_BAD_IN_A_ROW} malformed frames in a row")
                        return
                    await self._reply(error_text(vocab.INVALID, exc.message, exc.ref))
                    continue
                self._bad_in_a_row = 0
                await self._handle(frame)
        except (WebSocketDisconnect, OSError):
            pass

    async def _handle(self, frame: ClientFrame) -> None:
        try:
            reply = await self._apply(frame)
        except AppError as exc:
            await self._reply(error_text(exc.code, exc.message, frame.ref))
            return
        except (WebSocketDisconnect, OSError):
            raise
        except Exception as exc:
            if is_storage_error(exc):
                self.ctx.metrics.errors.labels("ws_storage").inc()
                await self._reply(error_text(UNAVAILABLE, f"{STORAGE_DOWN}: try again shortly", frame.ref))
                return
            log.exception("websocket frame %s failed in %s", frame.type, self.world)
            self.ctx.metrics.errors.labels("ws_internal").inc()
            await self._reply(error_text("internal", "the server failed to handle this frame", frame.ref))
            return
        if frame.ref is not None:
            await self._reply(ack_text(frame.ref, **reply))

    async def _apply(self, frame: ClientFrame) -> dict[str, Any]:
        """Do what the frame asks; returns what its ack carries."""
        engine, fields = self.ctx.engine, frame.fields
        if frame.type == "say":
            event = await engine.post_message(self.world, self.actor, fields["content"], fields["chat"])
            return {"seq": event["seq"], "id": event.get("id")}
        if frame.type == "tool_result":
            event = await engine.submit_tool_result(self.world, self.actor, fields["message"])
            return {"seq": event["seq"], "id": event.get("id")}
        await self._resync(fields["after"])
        return {"last_seq": self.last_seq}

    async def _resync(self, after: int | None) -> None:
        """The events after `after` (when given), then a snapshot.

        What a resync sends is charged against the connection's replay budget: a client that asks for
        the whole log again and again gets `too_many_requests` errors until the budget has refilled.
        """
        wait = self._replay_budget.wait()
        if wait > 0:
            self.ctx.metrics.errors.labels("ws_resync_limited").inc()
            raise AppError("too_many_requests",
                           f"resync sends too much: try again in {wait:.1f} s", status=429)
        async with self._lock:
            before = self._sent
            try:
                if after is not None:
                    self.last_seq = min(after, self.last_seq)
                    await self._replay()
                await self._send_snapshot()
            finally:
                self._replay_budget.charge(self._sent - before)
