"""The world page's own WebSocket: HTML fragments for htmx-ext-ws out, form values (JSON) in.

`/w/{world}/ws?chat=C&after=SEQ`: the live stream of server/api/live/stream.py (the JSON WebSocket's:
same admission, replay, gap filling, bounds, flood control, revocation and registry), rendered as
fragments. Every fragment is rendered once per role (FragmentCache) and the same string goes to every
page of that role and chat. What a page sends goes through the engine with the connection's Actor, so
the engine's role and ownership checks apply unchanged.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
from typing import Any

from starlette.websockets import WebSocket

from server import offload, vocab
from server.api.context import AppContext
from server.api.live import large_frames
from server.api.live.serve import serve
from server.api.live.stream import STORAGE_LOST, Stream
from server.engine.world.usage import usage_of
from server.errors import AppError, json_object
from server.tools.mcp.masking import masked_settings

from . import manage, markdown, views
from .render import Fragment, FragmentCache, Plan, partial, render, render_chunk, toast, usage_fragment

logger = logging.getLogger(__name__)
LEXER_WAIT = 2.0  # seconds a frame waits for its lexers to be made in a thread (web/markdown.py)
FRAME_BYTES = 256 * 1024  # fragments are batched into frames of about this size
QUEUE_SIZE = 2000  # live frames a page may fall behind before it is told to come back (1013)
MAX_INBOUND = 200_000


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

    `match` (approve_always only) maps argument names to globs; an empty glob allows any value of its
    argument, or none.
    """
    approval, choice = data.get("approval"), data.get("choice")
    if choice == "approve_edited" and isinstance(approval, str):  # edit before approve: the engine checks them
        edited = {"decision": vocab.APPROVE, "scope": "once", "arguments": data.get("arguments")}
        return {"role": "tool", "tool_call_id": approval, "content": json.dumps(edited)}
    if not isinstance(approval, str) or choice not in views.OPTION_KEYS:
        raise AppError(vocab.INVALID, "a decision needs an approval id and a choice "
                                      "(deny, approve_once, approve_session, approve_for, approve_always)")
    content: dict[str, Any] = ({"decision": vocab.DENY, "scope": "once"} if choice == "deny"
                               else {"decision": vocab.APPROVE, "scope": choice.removeprefix("approve_")})
    if choice == "approve_for":  # a grant for this chat that ends by itself (the engine checks the minutes)
        content["minutes"] = data.get("minutes")
    reason = data.get("reason")
    if choice == "deny" and isinstance(reason, str) and reason.strip():
        content["reason"] = reason.strip()
    match = data.get("match")
    if match is not None and not (isinstance(match, dict) and all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in match.items())):
        raise AppError(vocab.INVALID, "match must map argument names to glob strings")
    if choice == "approve_always" and match:
        # A glob is kept exactly as the person confirmed it: trimming could widen or narrow it. An
        # emptied one stays, as "any value": dropping it would let nothing by that name through.
        content["match"] = match
    return {"role": "tool", "tool_call_id": approval, "content": json.dumps(content)}


STALE_DECISION = ("That decision was made before the page reconnected and was not applied. "
                  "Look at the request again and decide anew.")


class PageConnection(Stream):
    """The page's socket: events and live frames as HTML fragments, batched into frames."""

    queue_frames = QUEUE_SIZE
    batch_chars = FRAME_BYTES
    joins = True
    # A 5 KB chunk of a fast reply can close thirty Markdown blocks with code in them: rendered on the
    # loop, it held every world's requests 10-28 ms. Past 2 KiB (about 4 ms of Markdown), a frame's
    # blocks go to a worker.
    heavy_frame = 2 * 1024
    heavy_event = markdown.LOOP_MARKDOWN  # (a replayed message's Markdown)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache = web_cache(self.ctx)
        self.tools = client_tools(self.ctx)
        self.chat = ""
        self.shown: dict[str, int] = {}  # how much of each streaming message this socket sent (web/streaming.py)
        # Echoed by the page in every decision: a frame from an earlier connection (queued while
        # offline, replayed on reconnect) carries another id and is refused.
        self.id = secrets.token_urlsafe(12)

    async def ready_for(self, text: str) -> None:
        # A code fence in a language whose lexer this process has not made: compiling its regular
        # expressions on the loop held it 20-45 ms (Python's). The frame waits for a thread to do it (not
        # for ever: past LEXER_WAIT it is made as it is, a streaming fence shown plain for now).
        if warming := markdown.lexers_warming(text):
            await asyncio.wait([asyncio.wrap_future(future) for future in warming], timeout=LEXER_WAIT)

    async def prepare(self) -> str:
        chats = [c["id"] for c in await self.ctx.engine.worlds.chats(self.world)]
        chat = self.websocket.query_params.get("chat") or ""
        self.chat = chat if chat in chats else (chats[-1] if chats else "")
        return render("_page_conn.html", conn=self.id)  # the first frame: this connection's id

    # -- rendering ---------------------------------------------------------------
    def replayed(self, event: dict[str, Any]) -> str:
        return self._shown_as(self.cache.event(self.world, event, self.actor.role, self.tools), event)

    def _shown_as(self, fragment: Fragment, event: dict[str, Any]) -> str:
        """What of `fragment` this page takes: a reply whose every streamed block it shows keeps them."""
        return fragment.for_view(self.chat, kept=self.cache.streams.kept(event.get("id"), self.shown))

    def _parsed(self, text: str) -> dict[str, Any]:
        # Keyed by the bus string itself: every local subscriber holds the same object, so it is parsed once.
        parsed: dict[str, Any] = self.cache.get_or_make(("json", self.world, text), lambda: json.loads(text))
        return parsed

    async def _parsed_off_loop(self, text: str) -> dict[str, Any]:
        """`_parsed` in a thread, or past offload.HEAVY_JSON in a worker process, once for every stream
        (large_frames.py): the parser holds the GIL (about 50 ms for a 16 MiB result, in which no world's
        request moves)."""
        if len(text) > offload.HEAVY_JSON:
            return await large_frames.shared(text)
        parsed: dict[str, Any] = await self.cache.made(("json", self.world, text), functools.partial(json.loads, text))
        return parsed

    def live_event(self, text: str) -> str:
        event = self._parsed(text)["event"]
        return self.replayed(event) + self._usage(event) + self._mcp_servers(event)

    async def replayed_off_loop(self, event: dict[str, Any]) -> str:
        """`replayed`, rendered in a worker process (a long message's Markdown holds the GIL)."""
        key, make = self.cache.event_plan(self.world, event, self.actor.role, self.tools)
        fragment: Fragment = await self.cache.made(key, make, process=True, light=not offload.is_large(event))
        return self._shown_as(fragment, event)

    async def live_event_off_loop(self, text: str) -> str:
        """`live_event` with the parsing in a thread and the rendering in a worker process (a long frame)."""
        event = (await self._parsed_off_loop(text))["event"]
        return await self.replayed_off_loop(event) + self._usage(event) + self._mcp_servers(event)

    def _mcp_servers(self, event: dict[str, Any]) -> str:
        """The world's settings changed: owners' pages list its MCP servers anew, with their states now."""
        if event.get("kind") != vocab.WORLD_UPDATED or self.actor.role not in vocab.CAN_MANAGE:
            return ""
        def make() -> str:  # env and header values are never rendered, whatever the event carries
            info = {"settings": masked_settings(event.get("settings") or {}),
                    "mcp_status": self.ctx.engine.world_tools.status(self.world)}
            return partial("_mcp_list.html", self.actor.role, world_id=self.world, **manage.mcp_context(info))
        key = ("mcp", self.world, event["seq"], event.get("ts"), self.actor.role)  # ts: a seq lost and taken again
        rendered: str = self.cache.get_or_make(key, make)
        return rendered

    def _usage(self, event: dict[str, Any]) -> str:
        """A reply with usage: the new sums of its agent and of the world (once per reply and role)."""
        if usage_of(event) is None:
            return ""
        def make() -> str:
            usage = self.ctx.engine.usage.known(self.world, event)
            return usage_fragment(usage, self.actor.role, [str(event["agent"])]) if usage is not None else ""
        key = ("usage", self.world, event["seq"], event.get("ts"), self.actor.role)
        rendered: str = self.cache.get_or_make(key, make)
        return rendered

    def live_other(self, text: str) -> str:
        """A live frame as this page's fragment ("" when it has nothing for this page)."""
        chat, plan = self._plan(self._parsed(text), text)
        return self.cache.finish(plan) if chat is None or chat == self.chat else ""

    async def live_other_off_loop(self, text: str) -> str:
        """`live_other` with the parsing and the rendering in a thread (a long chunk)."""
        chat, plan = self._plan(await self._parsed_off_loop(text), text)
        return await self.cache.finish_off_loop(plan) if chat is None or chat == self.chat else ""

    def _plan(self, frame: dict[str, Any], text: str) -> tuple[str | None, Plan]:
        if frame.get("type") == "chunk" and frame.get("chat") != self.chat:
            return frame.get("chat"), Plan("")  # not applied for this page: it starts the message if it shows it
        return self.cache.live_plan(self.world, text, frame, self.actor.role, self.shown)

    def notice(self, code: str, message: str) -> str:
        return toast(message.capitalize() + "…", "error")

    def lost_notice(self) -> str:
        return toast(STORAGE_LOST.capitalize() + ".", "error")

    def reset_notice(self, end: int) -> str:
        # The page shows messages the log no longer has; a fresh render shows the conversation as it is.
        return toast(f"{STORAGE_LOST.capitalize()}: reload the page to see the conversation as it is now.",
                     "error")

    async def send_state(self) -> None:
        """Live state that is not in the log: every agent's status, the MCP servers' (owners), who is here."""
        role = self.actor.role
        engine = self.ctx.engine
        agents = [agent["name"] for agent in await engine.worlds.agents(self.world)]
        for agent in agents:
            status = views.status_view(engine.status.get(self.world, agent))
            await self.emit(partial("_status.html", role, status=status))
        usage = engine.usage.known(self.world)
        if usage is not None:  # replies the page's render did not count yet
            await self.emit(usage_fragment(usage, role, agents))
        if role in vocab.CAN_MANAGE:  # what changed between the page's render and this socket's subscription
            for name, mcp in engine.world_tools.status(self.world).items():
                await self.emit(partial("_mcp_state.html", role, s=views.mcp_state_view(mcp, name)))
        await self.emit(partial("_members.html", role, members=self.ctx.presence.members(self.world)))
        for frame, step in self.cache.streams.streaming_in(self.chat):  # what streams now, so far
            if step.message_id not in self.shown:
                self.shown[step.message_id] = step.end
                await self.emit(render_chunk(frame, step, joining=True))

    # -- what the page sends -------------------------------------------------------
    async def on_message(self, message: dict[str, Any]) -> bool:
        text = message.get("text")
        if text is None or len(text) > MAX_INBOUND:
            await self.reply(toast("That message was too large or not text.", "error"))
        else:
            await self.handle(text)
        return True

    async def handle(self, text: str) -> None:
        engine = self.ctx.engine
        quiet = False
        kind: object = None
        data: dict[str, Any] = {}
        try:
            data = json_object(text, "a frame")
            kind = data.get("type")
            quiet = data.get("quiet") is True
            if kind == "say":
                await self.say(data)
            elif kind == "decide":
                if data.get("conn") != self.id:
                    raise AppError(vocab.CONFLICT, STALE_DECISION)
                await engine.submit_tool_result(self.world, self.actor, decision_message(data))
            elif kind == "decide_all":
                if data.get("conn") != self.id:
                    raise AppError(vocab.CONFLICT, STALE_DECISION)
                await self.decide_all(data)
            elif kind == "tool_result":
                await engine.submit_tool_result(self.world, self.actor, data.get("message"))
            elif kind == "stop":
                await self.stop(data)
            else:
                raise AppError(vocab.INVALID, "unknown frame type (say, decide, decide_all, tool_result or stop)")
        except AppError as exc:
            # A page that ran a client tool another page already answered need not hear about it; nor one that
            # lost a race to decide: its queue says who decided, and when (_decided.html), not an id in red.
            if not (exc.code == vocab.ALREADY_DECIDED and (quiet or await self._lost_race(kind, data))):
                await self.reply(toast(exc.message, "error"))
        except Exception:
            logger.exception("page frame failed in %s", self.world)
            await self.reply(toast("Something went wrong on the server; nothing was changed.", "error"))

    async def _lost_race(self, kind: object, data: dict[str, Any]) -> bool:
        """Whether a refused decision came after someone else's: its request is no longer pending (and not
        this person's own second approval of a request that still waits for others)."""
        if kind != "decide":
            return False
        pending = await self.ctx.engine.pending_approvals(self.world)
        return all(p.get("id") != data.get("approval") for p in pending)

    async def decide_all(self, data: dict[str, Any]) -> None:
        """"Approve all N" / "Deny all N": one decision, once, on exactly the requests the confirmation listed."""
        choice = data.get("choice")
        if choice not in ("approve_once", "deny"):
            raise AppError(vocab.INVALID, "a batch decision is approve_once or deny")
        decision = vocab.APPROVE if choice == "approve_once" else vocab.DENY
        content: dict[str, Any] = {"decision": decision, "scope": "once"}
        reason = data.get("reason")
        if choice == "deny" and isinstance(reason, str) and reason.strip():
            content["reason"] = reason.strip()
        outcomes = await self.ctx.engine.decide_listed(self.world, self.actor, data.get("approvals"), content)
        done = sum(1 for o in outcomes if o["outcome"] == "decided")
        verb = "Approved" if choice == "approve_once" else "Denied"
        others = [o for o in outcomes if o["outcome"] != "decided"]
        text = f"{verb} {done} of {len(outcomes)} calls, each once."
        if others:
            text += " Not decided here: " + "; ".join(str(o.get("message") or o["outcome"]) for o in others)
        await self.reply(toast(text, "warning" if others else "info"))

    async def say(self, data: dict[str, Any]) -> None:
        """A message; one to a chat deleted under its author goes back into her box, never lost."""
        chat, content = data.get("chat") or self.chat, data.get("content")
        try:
            await self.ctx.engine.post_message(self.world, self.actor, content, chat)
        except AppError as exc:
            if exc.code != vocab.NOT_FOUND or not isinstance(chat, str) or not isinstance(content, str) \
                    or chat in {c["id"] for c in await self.ctx.engine.worlds.chats(self.world)}:
                raise
            await self.reply(render("_say_returned.html", chat=chat, content=content))

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
            await self.reply(toast(f"{agent} had nothing to stop.", "info"))


async def page_socket(ws: WebSocket) -> None:
    await serve(ws, PageConnection)
