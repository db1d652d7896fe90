"""The world page's own WebSocket: HTML fragments for htmx-ext-ws out, form values (JSON) in.

`/w/{world}/ws?chat=C&after=SEQ`: every event after SEQ first (rendered from the log), then live
frames from the world's bus channel. Every fragment is rendered once per role (FragmentCache) and
the same string goes to every page of that role and chat. What a page sends goes through the
engine with the connection's Actor, so the engine's role and ownership checks apply unchanged.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from server import vocab
from server.api.context import AppContext, context_of
from server.api.origin import origin_allowed
from server.api.transport import bound_send_buffer, close_at_transport, stall_seconds
from server.api.ws_conn import STORAGE_DOWN, STORAGE_LOST
from server.api.ws_frames import revokes_invite
from server.bus import Gap, Overflow
from server.engine.actors import Actor
from server.engine.store import channel
from server.errors import AppError, json_object

from . import views
from .render import FragmentCache, partial, render, toast

log = logging.getLogger(__name__)
REPLAY_PAGE = 500
FRAME_BYTES = 256 * 1024  # replayed fragments are batched into frames of about this size
QUEUE_SIZE = 2000  # live frames a page may fall behind before it is told to come back (1013)
MAX_INBOUND = 200_000
RATE = 20.0  # frames per second a page may send, on average…
BURST = 60.0  # …with this much burst; beyond it the page is closed with 1008


def web_cache(ctx: AppContext) -> FragmentCache:
    """The app's fragment cache (one per app, so two servers in one process never share seqs)."""
    cache = ctx.extra.get("web.fragments")
    if cache is None:
        cache = ctx.extra["web.fragments"] = FragmentCache()
    return cache


def client_tools(ctx: AppContext) -> frozenset[str]:
    return frozenset(t.name for t in ctx.engine.tools.all() if t.location == "client")


def decision_message(data: dict[str, Any]) -> dict[str, Any]:
    """The `role: "tool"` decision (docs/protocol.md §4) a page's decision frame stands for.

    `match` (approve_always only) maps argument names to globs; an empty glob leaves that argument free.
    """
    approval, choice = data.get("approval"), data.get("choice")
    if choice == "approve_edited" and isinstance(approval, str):  # edit before approve: the engine checks them
        edited = {"decision": vocab.APPROVE, "scope": "once", "arguments": data.get("arguments")}
        return {"role": "tool", "tool_call_id": approval, "content": json.dumps(edited)}
    if not isinstance(approval, str) or choice not in views.OPTION_KEYS:
        raise AppError(vocab.INVALID, "a decision needs an approval id and a choice "
                                      "(deny, approve_once, approve_session, approve_always)")
    content: dict[str, Any] = ({"decision": vocab.DENY, "scope": "once"} if choice == "deny"
                               else {"decision": vocab.APPROVE, "scope": choice.removeprefix("approve_")})
    reason = data.get("reason")
    if choice == "deny" and isinstance(reason, str) and reason.strip():
        content["reason"] = reason.strip()
    match = data.get("match")
    if match is not None and not (isinstance(match, dict) and all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in match.items())):
        raise AppError(vocab.INVALID, "match must map argument names to glob strings")
    if choice == "approve_always" and match:
        # A glob is kept exactly as the person confirmed it: trimming could widen or narrow it.
        content["match"] = {k: v for k, v in match.items() if v}
    return {"role": "tool", "tool_call_id": approval, "content": json.dumps(content)}


STALE_DECISION = ("That decision was made before the page reconnected and was not applied. "
                  "Look at the request again and decide anew.")


class Stalled(Exception):
    """A write to this page stayed blocked too long: its client stopped reading."""


class InviteRevoked(Exception):
    """The invite this page came in with was revoked: the page's socket ends."""


class PageConnection:
    def __init__(self, ctx: AppContext, ws: WebSocket, world: str, chat: str, actor: Actor,
                 invite: str | None = None) -> None:
        self.ctx = ctx
        self.invite = invite
        self.ws = ws
        self.world = world
        self.chat = chat
        self.actor = actor
        self.cache = web_cache(ctx)
        self.tools = client_tools(ctx)
        self.last = 0  # the last seq this page was sent
        # Echoed by the page in every decision: a frame from an earlier connection (queued while
        # offline, replayed on reconnect) carries another id and is refused.
        self.id = secrets.token_urlsafe(12)
        self._send_lock = asyncio.Lock()
        self._allowance = BURST
        self._checked = time.monotonic()

    async def send(self, html: str) -> None:
        if html:
            async with self._send_lock:
                try:  # a page that stops reading must not hold its socket: see page_socket
                    async with asyncio.timeout(stall_seconds()):
                        await self.ws.send_text(html)
                except TimeoutError:
                    raise Stalled() from None

    def _fragment(self, event: vocab.Event) -> str:
        return self.cache.event(self.world, event, self.actor.role, self.tools).for_view(self.chat)

    async def replay(self, after: int, until: int | None = None) -> None:
        """Every event after `after` (up to `until`), batched into frames."""
        self.last = after
        while True:
            events = await self.ctx.engine.events(self.world, self.last, REPLAY_PAGE)
            batch: list[str] = []
            size = 0
            for event in events:
                if until is not None and event["seq"] > until:
                    break
                html = self._fragment(event)
                batch.append(html)
                size += len(html)
                self.last = event["seq"]
                if size >= FRAME_BYTES:
                    await self.send("".join(batch))
                    batch, size = [], 0
            await self.send("".join(batch))
            if len(events) < REPLAY_PAGE or (until is not None and self.last >= until):
                return

    async def current_state(self) -> None:
        """Live state that is not in the log: every agent's status, who is here."""
        role = self.actor.role
        engine = self.ctx.engine
        parts = [partial("_status.html", role, status=views.status_view(engine.status.get(self.world, a["name"])))
                 for a in await engine.worlds.agents(self.world)]
        parts.append(partial("_members.html", role, members=self.ctx.presence.members(self.world)))
        await self.send("".join(parts))

    def _parsed(self, text: str) -> dict[str, Any]:
        # Keyed by the bus string itself: every local subscriber holds the same object, so it is parsed once.
        parsed: dict[str, Any] = self.cache.get_or_make(("json", self.world, text), lambda: json.loads(text))
        return parsed

    def _render_live(self, text: str, frame: dict[str, Any]) -> str:
        """A live frame as this page's fragment ("" when it has nothing for this page)."""
        chat, html = self.cache.live(self.world, text, frame, self.actor.role)
        return html if chat is None or chat == self.chat else ""

    async def pump(self, sub: Any) -> None:
        """Live frames, in order; several queued ones go out as one frame."""
        while True:
            texts: list[str] = []
            gap: Gap | None = None
            try:
                texts.append(await sub.get())
                while len(texts) < 200 and (more := sub.get_nowait()) is not None:
                    texts.append(more)
            except Gap as caught:  # handled after the frames queued before it
                gap = caught
            out: list[str] = []
            for text in texts:
                frame = self._parsed(text)
                if frame.get("type") == "event":
                    event = frame["event"]
                    if revokes_invite(event, self.invite):
                        await self.send("".join(out))
                        raise InviteRevoked()
                    if event["seq"] <= self.last:
                        continue  # already sent by the replay
                    if event["seq"] > self.last + 1:  # missed while (re)subscribing: the log has it
                        await self.send("".join(out))
                        out = []
                        await self.replay(self.last, until=event["seq"] - 1)
                    out.append(self._fragment(event))
                    self.last = event["seq"]
                else:
                    out.append(self._render_live(text, frame))
            await self.send("".join(out))
            if gap is not None:
                await self.after_gap(gap)

    async def after_gap(self, gap: Gap) -> None:
        """The bus lost its connection: say so; once it is back, send what it missed from the log."""
        if gap.down:
            await self.send(toast(STORAGE_DOWN.capitalize() + "…", "error"))
            return
        if await self.ctx.engine.store.log.last_seq(self.world) < self.last:
            await self.send(toast(STORAGE_LOST.capitalize() + ".", "error"))
            await self.ws.close(code=1011, reason=STORAGE_LOST)
            return
        await self.replay(self.last)
        await self.current_state()

    def _within_rate(self) -> bool:
        now = time.monotonic()
        self._allowance = min(BURST, self._allowance + (now - self._checked) * RATE)
        self._checked = now
        self._allowance -= 1
        return self._allowance >= 0

    async def receive(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if not self._within_rate():
                await self.ws.close(code=1008, reason="too many messages")
                return
            text = message.get("text")
            if text is None or len(text) > MAX_INBOUND:
                await self.send(toast("That message was too large or not text.", "error"))
                continue
            await self.handle(text)

    async def handle(self, text: str) -> None:
        engine = self.ctx.engine
        quiet = False
        try:
            data = json_object(text, "a frame")
            kind = data.get("type")
            quiet = data.get("quiet") is True
            if kind == "say":
                chat = data.get("chat") or self.chat
                await engine.post_message(self.world, self.actor, data.get("content"), chat)
            elif kind == "decide":
                if data.get("conn") != self.id:
                    raise AppError(vocab.CONFLICT, STALE_DECISION)
                await engine.submit_tool_result(self.world, self.actor, decision_message(data))
            elif kind == "tool_result":
                await engine.submit_tool_result(self.world, self.actor, data.get("message"))
            elif kind == "stop":
                await self.stop(data)
            else:
                raise AppError(vocab.INVALID, "unknown frame type (say, decide, tool_result or stop)")
        except AppError as exc:
            # A page that ran a client tool another page already answered need not hear about it.
            if not (quiet and exc.code == vocab.ALREADY_DECIDED):
                await self.send(toast(exc.message, "error"))
        except Exception:
            log.exception("page frame failed in %s", self.world)
            await self.send(toast("Something went wrong on the server; nothing was changed.", "error"))


    async def stop(self, data: dict[str, Any]) -> None:
        """A stop button: the agent's LLM call, or (`"tool": true`, confirmed on the page) its running tool."""
        agent = data.get("agent")
        if not isinstance(agent, str) or not agent:
            raise AppError(vocab.INVALID, "stop needs an agent")
        engine = self.ctx.engine
        if data.get("tool") is True:
            stopped = await engine.cancel_tool(self.world, self.actor, agent)
        else:
            stopped = await engine.cancel_turn(self.world, self.actor, agent)
        if not stopped:
            await self.send(toast(f"{agent} had nothing to stop.", "info"))


async def page_socket(ws: WebSocket) -> None:
    ctx = context_of(ws)
    world = ws.path_params["world"]
    if not origin_allowed(ws, ctx.public_url):
        await ws.close(code=1008)  # before accept: the client gets a 403
        return
    try:
        principal = await ctx.auth.authenticate(ws, world)
        role = principal.role_in(world) if principal else None
        if principal is None or role is None:
            await ws.close(code=1008)
            return
        chats = [c["id"] for c in await ctx.engine.worlds.chats(world)]
    except AppError:
        await ws.close(code=1008)
        return
    chat = ws.query_params.get("chat") or ""
    if chat not in chats:
        chat = chats[-1] if chats else ""
    try:
        after = max(0, int(ws.query_params.get("after") or 0))
    except ValueError:
        after = 0
    await ws.accept()
    bound_send_buffer(ws)
    conn = PageConnection(ctx, ws, world, chat, Actor(principal.name, role), invite=principal.invite)
    await conn.send(render("_page_conn.html", conn=conn.id))  # the first frame: this connection's id
    presence = await ctx.presence.join(world, {"name": principal.name, "role": role})
    try:
        async with ctx.engine.store.bus.subscribe(channel(world), maxsize=QUEUE_SIZE) as sub:
            await conn.replay(after)
            await conn.current_state()
            tasks = {asyncio.create_task(conn.pump(sub)), asyncio.create_task(conn.receive())}
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, InviteRevoked):
                    with contextlib.suppress(Exception):
                        await ws.close(code=1008, reason="invite revoked")
                elif isinstance(result, (Overflow, Stalled)):
                    # This page fell behind: it reconnects by itself and resumes from its last seq. At the
                    # transport: a polite close would wait for a reader that does not read.
                    grace = 1.0 if isinstance(result, Stalled) else None
                    if not close_at_transport(ws, 1013, "fell behind", grace=grace):
                        with contextlib.suppress(Exception):
                            await ws.close(code=1013, reason="fell behind")
                elif isinstance(result, BaseException) and not isinstance(
                        result, (asyncio.CancelledError, WebSocketDisconnect, RuntimeError, OSError)):
                    log.error("page socket of %s failed", world, exc_info=result)
                    with contextlib.suppress(Exception):
                        await ws.close(code=1011)
    except WebSocketDisconnect:
        pass
    except Stalled:  # while replaying: the page stopped reading
        close_at_transport(ws, 1013, "fell behind", grace=1.0)
    finally:
        await ctx.presence.leave(world, presence)
