"""The inbox page (`GET /inbox`) and its live socket (`/inbox/ws`): every request the signed-in person can
decide, in every world they belong to, oldest first (issue #31 item 7).

The list is the engine's (server/engine/approvals/inbox.py), each request rendered by the queue's own
partial (templates/_approval.html through `views.approval_view`: the same redaction and hidden-character
warnings). The socket subscribes to the bus of each of the person's worlds (at most `INBOX_WORLDS`; the
owner's also takes in a world when a request appears there), and sends the list again whenever a request
arrives or is decided there. A decision comes back as a frame and goes through `Engine.submit_tool_result` with the
person's actor in that world, authenticated again for every frame (a revoked invite decides nothing).

Who is reading is checked again for every list, after reading it and before sending it, not only at the
handshake: a session ended, or an invite revoked, since the socket opened gets no more lists, only a close
(1008). A logout closes it at once, in whichever process holds it (server/api/auth/session_ends.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from server import vocab
from server.aio import cancel_and_wait
from server.api.auth.origin import origin_allowed
from server.api.auth.session_ends import CLOSE_CODE, CLOSE_REASON, session_ends
from server.api.auth.tokens import TOO_MANY
from server.api.context import AppContext, Principal, context_of
from server.api.inbox import inbox_actors
from server.api.live.serve import deny
from server.api.live.transport import bound_send_buffer, close_after_writes, close_at_transport
from server.bus import Gap, Overflow
from server.errors import AppError, json_object
from server.log.failures import StorageError

from . import views
from .live import decision_message
from .render import render, role_context

logger = logging.getLogger(__name__)
MAX_INBOUND = 200_000  # characters of one frame from the page
CLOSE_TIMEOUT = 5.0  # how long a close frame may wait behind a list being written
_RELEVANT = frozenset({vocab.MESSAGE, vocab.WORLD_UPDATED, vocab.WORLD_DELETED, vocab.CHAT_RENAMED,
                       vocab.CHAT_DELETED, vocab.INVITE_REVOKED})  # events that may change an inbox or its reader


def inbox_items(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The inbox's entries as the queue renders them, with where each belongs."""
    return [{"world": e["world"], "world_name": e["world_name"], "chat_title": e["chat_title"],
             "approval": views.approval_view(e["message"], e.get("approved_by"), e.get("may_decide"))}
            for e in entries]


def render_list(entries: list[dict[str, Any]]) -> str:
    # Only requests its reader can decide are listed: the queue's partial with its buttons.
    return render("_inbox_list.html", items=inbox_items(entries), **role_context(vocab.MEMBER))


def counts_of(entries: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry["world"]] = counts.get(entry["world"], 0) + 1
    return counts


async def inbox_page(request: Request) -> Response:
    ctx = context_of(request)
    principal = await ctx.auth.authenticate(request)
    if principal is None:
        return HTMLResponse(render("signin.html", message="You are not signed in."), status_code=401)
    entries = await ctx.engine.inbox(await inbox_actors(ctx.engine, principal))
    response = HTMLResponse(render("inbox.html", listing=render_list(entries), total=len(entries), me=principal.name,
                                   owner=principal.owner, world=principal.world))
    response.headers["Cache-Control"] = "no-store"
    return response


class LiveInbox:
    """One page's live inbox: a follower per world, and the list sent again after each change."""

    world = None  # (for session_ends.py: it authenticates the socket again without a world)

    def __init__(self, ws: WebSocket, ctx: AppContext, principal: Principal) -> None:
        self.websocket, self.ctx, self.principal = ws, ctx, principal
        self.counts_only = ws.query_params.get("view") == "counts"  # the worlds list: counts and the total
        self.changed = asyncio.Event()
        self.followed: dict[str, asyncio.Task[None]] = {}
        self._joining: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one frame at a time, and the close after the frame being written
        self._sealed = False
        self._closed = False  # its close is under way
        self._ended = False  # its close frame went out (or could not): `run` ends

    async def run(self) -> None:
        ends, session = session_ends(self.ctx), self.principal.session
        reader: asyncio.Task[None] | None = None
        try:
            await ends.watch(self, session)  # a logout closes it (in whichever process)
            for world in await inbox_actors(self.ctx.engine, self.principal):
                await self.follow(world)
            if self.principal.owner:
                self.ctx.engine.store.observers.append(self._observed)
            reader = asyncio.create_task(self._read(), name="inbox-reader")
            self.changed.set()  # the first list: read after every subscription started
            while not reader.done() and not self._ended:  # closed: it ends, answered by the client or not
                waiter = asyncio.create_task(self.changed.wait())
                await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if self.changed.is_set() and not reader.done() and not self._ended:
                    self.changed.clear()
                    await self.send_list()
            if reader.done() and not reader.cancelled() and (failed := reader.exception()) is not None:
                raise failed  # the reader's own failure: answered below, as the writer's would be
        except WebSocketDisconnect:
            pass  # the client went away
        except StorageError:  # the page reconnects, and gets the list then
            self.seal()
            await self.close(1013, "storage unavailable: reconnect")
        except Exception:
            logger.exception("inbox socket failed")
            self.seal()
            await self.close(1011, "internal error")
        finally:
            # (A decision under way is the engine's to finish: Engine.submit_tool_result outlives its caller.)
            await cancel_and_wait(reader)
            ends.unwatch(self, session)
            if self._observed in self.ctx.engine.store.observers:
                self.ctx.engine.store.observers.remove(self._observed)
            for task in self._joining:
                task.cancel()
            for task in self.followed.values():
                task.cancel()
            for task in self.followed.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def follow(self, world: str) -> None:
        """Follow `world`'s bus (at most INBOX_WORLDS worlds); returns once subscribed."""
        if world in self.followed or len(self.followed) >= self.ctx.engine.INBOX_WORLDS:
            return
        ready = asyncio.Event()
        self.followed[world] = asyncio.create_task(self._follow(world, ready), name=f"inbox-{world}")
        await ready.wait()

    async def _follow(self, world: str, ready: asyncio.Event) -> None:
        try:
            while True:
                async with self.ctx.engine.subscribe(world, maxsize=100) as sub:
                    ready.set()
                    self.changed.set()  # (again) subscribed: what came meanwhile is in the next list
                    while True:
                        try:
                            text = await sub.get()
                        except Overflow:
                            break  # cut off: subscribe again
                        except Gap:
                            self.changed.set()
                            continue
                        if _relevant(text):
                            self.changed.set()
        finally:
            ready.set()  # a follower that failed to subscribe does not hold the socket up

    def _observed(self, world: str, event: vocab.Event) -> None:
        """The owner's: a request in a world not followed yet (appended here, or heard by this process's
        listener of a world it hosts, as every world with work is) brings that world into the inbox."""
        if world not in self.followed and views.is_approval_request(event):
            task = asyncio.get_running_loop().create_task(self.follow(world), name=f"inbox-join-{world}")
            self._joining.add(task)
            task.add_done_callback(self._joining.discard)

    async def send_list(self) -> None:
        """The list, read and only then sent if its reader is still signed in: nothing in it was added
        after their session ended or their invite was revoked."""
        entries = await self.ctx.engine.inbox(
            {w: self.principal.actor(w) for w in self.followed if self.principal.role_in(w) is not None})
        principal = await self._signed_in()
        if principal is None:
            return
        self.principal = principal
        entries = [e for e in entries if principal.role_in(e["world"]) is not None]
        frame: dict[str, Any] = {"type": "inbox", "total": len(entries), "counts": counts_of(entries)}
        if not self.counts_only:
            frame["html"] = render_list(entries)
        await self._send(json.dumps(frame))

    async def _signed_in(self) -> Principal | None:
        """Who reads this socket now, or None once nobody does (a session ended, an invite revoked since the
        handshake): then it is sealed and closed."""
        principal = await self.ctx.auth.authenticate(self.websocket, again=True)
        if principal is None:
            self.seal()
            await self.close(CLOSE_CODE, CLOSE_REASON if self.principal.session else "invite revoked or world deleted")
        return principal

    def seal(self) -> None:
        """Send nothing more but the close (session_ends.py: in the turn that learns the session ended)."""
        self._sealed = True

    async def close(self, code: int, reason: str = "") -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not await close_after_writes(self.websocket, self._lock, code, reason, CLOSE_TIMEOUT):
                close_at_transport(self.websocket, code, reason)  # behind a list it does not read, or gone
        finally:
            self._ended = True
            self.changed.set()  # (wakes `run`, which then ends: after the close frame, not before it)

    async def _send(self, text: str) -> None:
        async with self._lock:
            if not self._sealed and not self._closed:
                await self.websocket.send_text(text)

    async def _read(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if self._sealed:  # its close is on the way: nothing it asks is done
                continue
            text = message.get("text")
            if text is None:  # a binary frame
                await self._send(json.dumps({"type": "error", "code": vocab.INVALID,
                                             "message": "an inbox frame is JSON text"}))
                continue
            await self.handle(text)

    async def handle(self, text: str) -> None:
        try:
            if len(text) > MAX_INBOUND:
                raise AppError(vocab.INVALID, "that frame was too large")
            data = json_object(text, "a frame")
            world = data.get("world")
            if data.get("type") != "decide" or not isinstance(world, str):
                raise AppError(vocab.INVALID, 'an inbox frame is {"type": "decide", "world", "approval", "choice"}')
            # Who this is, again: a session ended or an invite revoked since the socket opened decides nothing.
            principal = await self._signed_in()
            if principal is None:
                return
            actor = principal.actor(world)
            if not principal.owner and (wait := self.ctx.floods.retry_after(world, actor.identity)):
                raise AppError(TOO_MANY, f"too many decisions: try again in {wait} s")
            await self.ctx.engine.submit_tool_result(world, actor, decision_message(data))
        except AppError as exc:
            await self._send(json.dumps({"type": "error", "code": exc.code, "message": exc.message}))
        except Exception:
            logger.exception("inbox frame failed")
            await self._send(json.dumps({"type": "error", "code": "internal",
                                         "message": "Something went wrong on the server; nothing was changed."}))


def _relevant(text: str) -> bool:
    try:
        frame = json.loads(text)
    except ValueError:
        return False
    if not isinstance(frame, dict):
        return False
    if frame.get("type") == "missed":
        return True
    event = frame.get("event")
    return frame.get("type") == "event" and isinstance(event, dict) and event.get("kind") in _RELEVANT


async def inbox_socket(ws: WebSocket) -> None:
    ctx = context_of(ws)
    if not origin_allowed(ws, ctx.public_url):
        await deny(ws, AppError(vocab.FORBIDDEN, "cross-origin WebSocket refused"))
        return
    principal = await ctx.auth.authenticate(ws)
    if principal is None:
        await deny(ws, AppError("unauthorized", "authentication required", status=401))
        return
    await ws.accept()
    bound_send_buffer(ws)  # a client that stops reading holds up its one list in flight, not megabytes of buffer
    with contextlib.suppress(WebSocketDisconnect):
        await LiveInbox(ws, ctx, principal).run()
