"""The one live stream of a world to one socket: replay, snapshot or state, live frames, gap filling,
overflow, flood control and revocation. The JSON WebSocket (live/json_connection.py) and the page's fragment socket
(web/live.py) are two renderings of it: they say how an event, a live frame and the current state look
on their socket, and what a client frame does; everything else is here, once.

Ordering: the writer and the replies to client frames share one lock, so every frame is written whole and
the stream of events a socket sends is gapless and duplicate-free: `last_seq` is the last event sent;
a live event at or below it is dropped, one past `last_seq + 1` is preceded by the missing ones from the log.
"""
from __future__ import annotations

import abc
import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from starlette.websockets import WebSocket, WebSocketDisconnect

from ... import offload, vocab
from ...aio import Slices, next_turn
from ...bus import Gap, Overflow, Subscription
from ...engine.actors import Actor
from ...errors import AppError
from ...log.failures import StorageError
from ..auth.session_ends import CLOSE_CODE, CLOSE_REASON
from ..context import AppContext
from ..flood import RATE  # client frames (with HTTP writes): beyond the bucket, closed with 1008
from .batches import LARGE_WRITE, joined, superseded_dropped
from .json_frames import EVENT_PREFIX, event_info, event_info_off_loop, is_world_deleted, revokes_invite
from .transport import close_after_writes, close_at_transport

logger = logging.getLogger(__name__)

PAGE = 500  # events per log read while replaying
CLOSE_TIMEOUT = 5.0  # how long a close frame may wait behind a client that does not read
UNAVAILABLE = "storage_unavailable"  # the code of error frames (and HTTP 503 bodies) saying the storage is down
STORAGE_DOWN = "storage unavailable, retrying"
STORAGE_LOST = "the storage lost this world's events"
# A live frame this long is rendered off the loop by the writer, in its turn (a page renders 16 KiB of
# Markdown in about 30 ms). `Stream.heavy_frame` is the socket's own.
HEAVY_FRAME = 16 * 1024


def may_end_stream(kind: str | None) -> bool:
    """Whether an event of this kind may end a stream (`Stream._end_if` says whether it does)."""
    return is_world_deleted(kind) or kind == vocab.INVITE_REVOKED


class _WorldGone(Exception):
    """The world was deleted: after forwarding that event the stream ends."""


class _Revoked(Exception):
    """The invite this stream came in with was revoked: after forwarding that event it ends."""


class _SessionEnded(Exception):
    """The session this stream came in with ended, and the bus lost the news of it (a gap)."""


class _Behind(Exception):
    """The client is `queue_frames` behind: it is cut off (1013)."""

    def __init__(self, frames: int) -> None:
        super().__init__(frames)
        self.frames = frames


class _Lost(Exception):
    """The log ends before what the stream sent (the storage lost events): it ends, saying where to go on."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class Stream(abc.ABC):
    """One socket's stream. Subclasses render (`replayed`, `live_event`, `live_other`, `send_state`,
    `notice`) and answer client frames (`on_message`)."""

    queue_frames: ClassVar[int] = 1000  # live frames it may fall behind before it is cut off (1013)
    batch_chars: ClassVar[int] = 1 << 16  # frames wait to be written together up to this size
    joins: ClassVar[bool] = False  # frames written together are joined into one message (else one each)
    heavy_frame: ClassVar[int] = HEAVY_FRAME  # a live frame this long is made off the loop, in the writer's turn
    heavy_event: ClassVar[int] = offload.HEAVY  # characters of a replayed event made off the loop

    def __init__(self, websocket: WebSocket, ctx: AppContext, world: str, actor: Actor, sub: Subscription,
                 invite: str | None = None, invite_digest: str | None = None, session: str | None = None) -> None:
        self.websocket, self.ctx, self.world, self.actor, self.sub = websocket, ctx, world, actor, sub
        self.invite, self.invite_digest = invite, invite_digest  # the invite it came in with (None: the owner)
        self.session = session  # the key of the browser session it came in with (None: a bearer token)
        self.last_seq = 0
        self.sending_since: float | None = None  # loop time a blocked send began (for the stall sweeper)
        self.closed = False
        self._sealed = False  # see seal()
        self._lock = asyncio.Lock()
        self._bucket = ctx.floods.bucket(world, actor.identity)  # shared with their other sockets and writes
        self._tasks: list[asyncio.Task[None]] = []
        self._sent = 0  # characters written so far
        self._out: list[str] = []  # rendered frames waiting to be joined into one
        self._out_chars = 0

    # -- what a socket makes of the stream ------------------------------------------
    @abc.abstractmethod
    def replayed(self, event: dict[str, Any]) -> str:
        """An event read from the log, as this socket shows it ("" for nothing)."""

    @abc.abstractmethod
    def live_event(self, text: str) -> str:
        """An event frame from the bus (its text, as appended), as this socket shows it."""

    @abc.abstractmethod
    def live_other(self, text: str) -> str:
        """Any other live frame (chunk, status, presence…), as this socket shows it."""

    async def replayed_off_loop(self, event: dict[str, Any]) -> str:
        """`replayed` of a large event, its heavy part off the loop (when it has one)."""
        return self.replayed(event)

    async def live_event_off_loop(self, text: str) -> str:
        """`live_event` of a long frame, its heavy part in a thread (when it has one)."""
        return self.live_event(text)

    async def live_other_off_loop(self, text: str) -> str:
        """`live_other` of a long frame, its heavy part in a thread (when it has one)."""
        return self.live_other(text)

    @abc.abstractmethod
    async def send_state(self) -> None:
        """What is true now, after a replay (the lock is held; `emit` what to send)."""

    @abc.abstractmethod
    def notice(self, code: str, message: str) -> str:
        """A notice from the server (e.g. the storage is down) as this socket shows it."""

    @abc.abstractmethod
    async def on_message(self, message: dict[str, Any]) -> bool:
        """A client frame within the rate; False ends the reader."""

    async def prepare(self) -> str:
        """Before anything is sent: look up what the socket needs; returns its first frame ("" for none)."""
        return ""

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
        """End this stream now (a client that does not read): its close frame goes behind what is
        buffered, and its transport is aborted after `grace` seconds, so its descriptor is released."""
        self.closed = True
        close_at_transport(self.websocket, code, reason or f"client too slow: reconnect with after={self.last_seq}",
                           grace)
        for task in self._tasks:
            task.cancel()

    def seal(self) -> None:
        """Write nothing more but a close frame. Called in the turn that learns the stream must end, before
        its `close` (a task of its own) is under way: news the bus handed over in the same turn, read with
        the end from the same socket, would otherwise go out first."""
        self._sealed = True

    async def close(self, code: int, reason: str = "") -> None:
        """Send a close frame after any frame being written; at the transport for a client that does not read."""
        if self.closed:
            return
        self.closed = True
        if not await close_after_writes(self.websocket, self._lock, code, reason, CLOSE_TIMEOUT):
            self.abort(code, reason)

    # -- writing ---------------------------------------------------------------
    async def _send(self, text: str) -> None:
        """Write one frame (the caller holds the lock)."""
        if text:
            await self._send_frames([text])

    async def _send_frames(self, texts: list[str]) -> None:
        """Write these frames, each a message of its own."""
        size = sum(map(len, texts))
        if size > LARGE_WRITE:
            await next_turn()
        if self.closed:
            raise WebSocketDisconnect(1000)
        self._sent += size
        self.sending_since = asyncio.get_running_loop().time()
        try:
            for text in texts:
                if self._sealed:  # its close is on the way (a send may wait for room): the rest goes nowhere
                    return
                await self.websocket.send_text(text)
        finally:
            self.sending_since = None

    async def emit(self, text: str) -> None:
        """Queue `text` to be written once `batch_chars` are waiting (the caller holds the lock, and flushes
        before releasing it)."""
        if text:
            self._out.append(text)
            self._out_chars += len(text)
            if self._out_chars >= self.batch_chars:
                await self.flush()

    async def flush(self) -> None:
        if self._out:
            out = joined(self._out) if self.joins else self._out
            self._out, self._out_chars = [], 0
            await self._send_frames(out)

    async def reply(self, text: str) -> None:
        async with self._lock:
            await self._send(text)

    async def _write(self, after: int) -> None:
        try:
            async with self._lock:
                await self._send(await self.prepare())
                await self._recheck()  # subscribed: a revocation from now on reaches the stream
                end = await self.ctx.engine.last_seq(self.world)
                if after > end:  # it holds events the log no longer has (Redis lost its latest writes)
                    await self._send(self.reset_notice(end))
                self.last_seq = min(after, end)  # a client's claim must not make us drop the events to come
                await self.replay()
                await self.send_state()
                await self.flush()
            slices = Slices()
            while True:
                if self.sub.overflowed:  # cut off by the bus: don't drain a backlog the client can't take
                    raise Overflow(self.sub.channel)
                try:
                    batch = [await self.sub.get()]
                    gap: Gap | None = None
                    try:  # what is already queued goes in one go: one wake-up and one write per burst
                        while (more := self.sub.get_nowait()) is not None:
                            batch.append(more)
                    except Gap as after:  # handled after the frames queued before it
                        gap = after
                    slices.begin()
                    async with self._lock:
                        texts = superseded_dropped(batch)
                        for i, text in enumerate(texts):
                            # Checked frame by frame, as the transport takes them: a batch may be the bound long.
                            if (behind := self.behind(len(texts) - i)) > self.queue_frames:
                                await self.flush()  # what last_seq counts is written, then the close after it
                                raise _Behind(behind)
                            await self._forward(text)
                            await slices.step()  # a long burst: other worlds' requests between its frames
                        await self.flush()
                    if gap is not None:
                        raise gap
                except Gap as gap:
                    async with self._lock:
                        await self.flush()
                        await self._after_gap(gap)
                        await self.flush()
        except (Overflow, _Behind) as slow:
            self.ctx.metrics.errors.labels("ws_overflow").inc()
            behind = slow.frames if isinstance(slow, _Behind) else self.queue_frames
            logger.warning("websocket of %s closed 1013: client %d frames behind (bound %d), after=%d",
                           self.world, behind, self.queue_frames, self.last_seq)
            self.abort(1013, f"client too slow: reconnect with after={self.last_seq}")
        except _WorldGone:
            await self.close(1000, "world deleted")
        except _Revoked:
            await self.close(1008, "invite revoked")
        except _SessionEnded:
            await self.close(CLOSE_CODE, CLOSE_REASON)
        except _Lost as lost:  # closed here, not under the lock (close takes it: it waited CLOSE_TIMEOUT for it)
            # The log's end, as a resumed stream's (1013) says where to go on: events after it are new ones.
            await self.close(1011, f"{STORAGE_LOST}: reconnect with after={lost.end}")
        except (WebSocketDisconnect, OSError):
            pass  # the client went away
        except AppError as exc:  # e.g. the world was deleted while replaying
            await self.close(1011, exc.message)
        except StorageError as exc:  # the client comes back and resumes once the storage answers
            logger.warning("websocket of %s closed: storage failed (%s: %s)", self.world, type(exc).__name__, exc)
            await self.close(1013, f"{STORAGE_DOWN}: reconnect with after={self.last_seq}")
        except Exception:
            logger.exception("websocket writer failed in %s", self.world)
            await self.close(1011, "internal error")

    def behind(self, taken: int = 0) -> int:
        """Frames the client has yet to get: `taken` from the queue and not yet written, those still
        queued, and those emitted and not yet written. (The transport holds at most its high-water mark
        more: uvicorn's `send` waits below it.)"""
        return taken + self.sub.pending() + len(self._out)

    def _in_order(self, text: str) -> tuple[str | None, int]:
        """A live frame as this socket shows it, when nothing has to happen before or after it: any frame
        but an event, or the event after `last_seq` that cannot end the stream (else None); and `last_seq`
        once it is sent."""
        if not text.startswith(EVENT_PREFIX):
            return self.live_other(text), self.last_seq
        seq, kind = event_info(text)
        if seq != self.last_seq + 1 or may_end_stream(kind):
            return None, self.last_seq
        return self.live_event(text), seq

    async def _in_order_off_loop(self, text: str) -> tuple[str | None, int]:
        """`_in_order` of a long frame: its rendering in a thread while the loop serves everyone else; the
        writer awaits it in its turn (holding the lock), so this stream's frames stay in order."""
        if not text.startswith(EVENT_PREFIX):
            return await self.live_other_off_loop(text), self.last_seq
        seq, kind = await event_info_off_loop(text)
        if seq != self.last_seq + 1 or may_end_stream(kind):
            return None, self.last_seq
        return await self.live_event_off_loop(text), seq

    async def ready_for(self, text: str) -> None:
        """Wait for what making this light frame on the loop needs (web/live.py: a page's lexers)."""
        return None  # (a JSON socket's frames need nothing)

    async def _forward(self, text: str) -> None:
        """A live frame: events once each and in order, everything else as it comes."""
        heavy = len(text) > self.heavy_frame
        if not heavy:
            await self.ready_for(text)
        rendered, seq = await self._in_order_off_loop(text) if heavy else self._in_order(text)
        if rendered is not None:
            await self.emit(rendered)
            self.last_seq = seq
            return
        seq, kind = await event_info_off_loop(text)
        if seq <= self.last_seq:  # a copy: still checked, the client's after= may have skipped the event
            await self._end_if(kind, lambda: json.loads(text)["event"])
            return
        if seq > self.last_seq + 1:
            await self.replay(until=seq - 1)
        await self.emit(await self.live_event_off_loop(text) if heavy else self.live_event(text))
        self.last_seq = seq
        await self._end_if(kind, lambda: json.loads(text)["event"])

    async def _end_if(self, kind: str | None, event: Callable[[], dict[str, Any]]) -> None:
        """Every event that leaves the stream passes here, whichever way it came (live, gap-filled, replayed
        with a snapshot): after the deletion of the world, or the revocation of this socket's invite, it ends.
        (`_in_order` passes the events of other kinds on without coming here.)"""
        if is_world_deleted(kind):
            await self.flush()
            raise _WorldGone()
        if kind == vocab.INVITE_REVOKED and revokes_invite(event(), self.invite):
            await self.flush()
            raise _Revoked()

    async def still_admitted(self) -> bool:
        """Whether the invite this socket came in with is still open (always, for the owner's sockets; an
        ended session is session_ends.py's). One key read: at subscribing, after a gap, before a write."""
        if self.invite is None:
            return True
        if self.invite_digest is None:
            return False
        return await self.ctx.engine.find_invite(self.world, self.invite_digest) is not None

    async def _may_act(self) -> bool:
        """Before a client frame is applied: the bus may not have brought the revocation yet (a late publish),
        and a write of the revoked member must not land meanwhile. Storage down: the frame's answer says so."""
        try:
            return await self.still_admitted()
        except StorageError:
            return True

    async def _recheck(self) -> None:
        """Revoked while the stream could not see it (before it subscribed, or in a gap of the bus): ends it."""
        if not await self.still_admitted():
            await self.flush()
            raise _Revoked()

    async def _after_gap(self, gap: Gap) -> None:
        """The bus lost its connection: say so; once it is back, send what it missed from the log."""
        if gap.down:
            await self._send(self.notice(UNAVAILABLE, STORAGE_DOWN))
            return
        end = await self.ctx.engine.last_seq(self.world)
        if end < self.last_seq:  # e.g. Redis restarted without persistence, or from an older snapshot
            await self._send(self.lost_notice())
            raise _Lost(end)
        await self._recheck()  # the bus may have lost the revocation of the invite (not the log)
        if self.session is not None and await self.ctx.auth.authenticate(self.websocket, self.world,
                                                                          again=True) is None:
            self.seal()  # and the end of its session (said on the bus only): nothing of the gap reaches it
            raise _SessionEnded()
        await self.replay()
        await self.send_state()

    def lost_notice(self) -> str:
        """What the client sees before the close that says the storage lost the world's events."""
        return ""

    def reset_notice(self, end: int) -> str:
        """What a client that holds events past the log's `end` sees first: the storage lost them, and
        the events to come after `end` are new ones, not those."""
        return self.lost_notice()

    async def replay(self, until: int | None = None) -> None:
        """Emit the logged events after `last_seq` (up to `until`, or to the end of the log)."""
        slices = Slices()  # a replay of many events gives the loop back every few milliseconds
        while until is None or self.last_seq < until:
            limit = PAGE if until is None else min(PAGE, until - self.last_seq)
            events = await self.ctx.engine.events(self.world, self.last_seq, limit)
            slices.begin()
            for event in events:
                large = offload.is_large(event, self.heavy_event)
                if not large and isinstance(content := event.get("content"), str):
                    await self.ready_for(content)
                await self.emit(await self.replayed_off_loop(event) if large else self.replayed(event))
                self.last_seq = event["seq"]
                await self._end_if(event.get("kind"), lambda: event)  # noqa: B023 (called at once)
                await slices.step()
            if len(events) < limit:
                return

    # -- reading ---------------------------------------------------------------
    async def _read(self) -> None:
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if self._sealed:  # its session ended: nothing it asks is done, its close is on the way
                    continue
                if not self._bucket.take():
                    self.ctx.metrics.errors.labels("ws_flood").inc()
                    await self.close(1008, f"too many frames: at most {RATE:g} a second")
                    return
                if not await self._may_act():
                    await self.close(1008, "invite revoked")
                    return
                if not await self.on_message(dict(message)):
                    return
        except (WebSocketDisconnect, OSError):
            pass
