"""One Jinja2 environment (autoescaped) and the renderings of events and live frames into htmx fragments.

The same partials render the first page (oob=False) and every live fragment (oob=True): a fragment
is the partial's root element carrying `hx-swap-oob`, so htmx-ext-ws swaps it into place.
"""
from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import escape

from server import offload, vocab
from server.aio import SingleFlight
from server.engine.approvals.decisions import is_vote
from server.engine.world.invites import shown_invite

from . import views
from .elicitations import is_answer, is_question, question_view
from .markdown import Rendered
from .streaming import Step, Streams


def _assets(name: str) -> Path:
    """`templates/` or `static/`: inside web/ once installed from a wheel, beside it in the source tree."""
    installed = Path(__file__).resolve().parent / name
    return installed if installed.is_dir() else installed.parents[1] / name


TEMPLATES = _assets("templates")
STATIC = _assets("static")

env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"], default=True),
                  trim_blocks=True, lstrip_blocks=True, auto_reload=False)
env.filters["pretty"] = views.pretty
env.filters["short_time"] = lambda ts: ts[11:19] if isinstance(ts, str) and len(ts) >= 19 else ""


def compile_templates() -> None:
    """Compile every template now, before the server answers (Jinja keeps them: 69 in 0.16 s). Compiled at
    their first use instead, on the event loop, a page's first view and each partial's first live frame
    held it 5-250 ms, and every world waited; in a thread meanwhile, they competed with the loop."""
    for name in env.list_templates(extensions=["html"]):  # (not an editor's swap file beside them)
        env.get_template(name)


def role_context(role: str) -> dict[str, Any]:
    """What a template needs to know about the viewer: which controls would work for them."""
    return {"role": role, "can_send": role in vocab.CAN_SEND, "can_decide": role in vocab.CAN_DECIDE,
            "can_manage": role in vocab.CAN_MANAGE}


def render(template: str, /, **context: Any) -> str:
    # Positional-only: a template may take a `name` of its own (_world_name.html does).
    return env.get_template(template).render(**context)


def partial(template: str, role: str, /, **context: Any) -> str:
    """A partial as a live fragment (swapped out of band)."""
    return render(template, oob=True, **role_context(role), **context)


@dataclass(frozen=True)
class Fragment:
    """One event rendered for one role: the frame for pages showing its chat, and for every other page."""
    seq: int
    chat: str | None
    in_view: str
    elsewhere: str
    # A finished reply, for a page that showed every block of its stream: the article keeps those blocks
    # (`hx-preserve`) and gets only the HTML after them. None: the page takes `in_view`.
    kept_view: str | None = None

    def for_view(self, chat: str, kept: bool = False) -> str:
        if self.chat != chat:
            return self.elsewhere
        return self.kept_view if kept and self.kept_view is not None else self.in_view


def render_event(event: vocab.Event, role: str, client_tools: frozenset[str], streamed: Rendered = ()) -> Fragment:
    """Everything a persisted event changes on a page, for a viewer of `role` (`streamed`: the blocks the
    message's stream rendered, web/streaming.py)."""
    item = views.conversation_item(event, streamed)
    if item and item["type"] == "step":  # fills in its call's step, as views.conversation does on the first page
        in_chat = partial("_step_parts.html", role, part=item["part"])
    else:
        in_chat = partial("_item.html", role, item=item, world_id=event.get("world")) if item else ""
    kept = None
    if item and item.get("after_blocks") is not None:  # (message ids are the runner's: `msg_` and hex)
        kept = (partial("_item.html", role, item={**item, "kept": True}, world_id=event.get("world"))
                + f'<div hx-swap-oob="beforeend:#blocks-{escape(item["message_id"])}">{item["after_blocks"]}</div>')
    # Every frame ends with the page's new last seq, which a reconnect resumes after.
    rest = _world_part(event, role, client_tools) + _files_part(event) + render("_seq.html", seq=event["seq"], oob=True)
    renamed = event.get("chat") if event.get("kind") == vocab.CHAT_RENAMED else None
    if isinstance(renamed, dict):  # the header names the open chat: only the pages showing it change it
        return Fragment(event["seq"], renamed.get("id"), partial("_header_title.html", role, chat=renamed) + rest, rest)
    return Fragment(event["seq"], event.get("chat"), in_chat + rest, rest, kept + rest if kept is not None else None)


def _files_part(event: vocab.Event) -> str:
    """After an upload or a server tool's result (which may have written files), the files panel lists the
    workspace again: static/files.js watches #files-changed."""
    kind = event.get("kind")
    ran = (kind == vocab.MESSAGE and event.get("role") == "tool" and event.get("sender") == vocab.SERVER_SENDER
           and not event.get("decision") and not event.get("not_run"))
    if kind != vocab.FILE_UPLOADED and not ran:
        return ""
    return f'<div id="files-changed" hidden hx-swap-oob="true" data-seq="{int(event["seq"])}"></div>'


def _world_part(event: vocab.Event, role: str, client_tools: frozenset[str]) -> str:
    kind = event.get("kind")
    owner = role in vocab.CAN_MANAGE
    if kind == vocab.MESSAGE:
        if is_question(event):  # an MCP server asks a person: an item of the same queue
            return partial("_elicitation.html", role, question=question_view(event))
        if is_answer(event):
            return delete(f"elicitation-{event.get('tool_call_id')}")
        if views.is_approval_request(event):
            return partial("_approval.html", role, approval=views.approval_view(event))
        if event.get("role") == "tool" and is_vote(event):  # one of several approvals: the request stays
            decision = event.get("decision") or {}
            who = views.who_decides(event.get("tool_call_id"),
                                    max(int(decision.get("required") or 2) - len(decision.get("voters") or []), 1),
                                    decision.get("may_decide"))
            return partial("_votes.html", role, votes=views.vote_view(event)) + (
                partial("_who_decides.html", role, who=who) if who else "")
        if event.get("role") == "tool" and event.get("decision"):
            # Replaces the request in the queue; the page removes it and, if it was open, says who decided.
            return partial("_decided.html", role, decided=views.decided_view(event))
        if event.get("role") == "tool" and event.get("name") in client_tools:
            return delete(f"cc-{event.get('tool_call_id')}")
        return "".join(partial("_client_call.html", role, call=c) for c in views.client_calls_of(event))
    if kind in (vocab.AGENT_ADDED, vocab.AGENT_UPDATED):
        # The sidebar's agent (or its line), and for owners its configuration in the settings view: each page
        # takes the one it has a place for (app.js drops a fragment with nowhere to go).
        agent = views.agent_view(event["agent"])
        config = partial("_agent_config.html", role, agent=agent, world_id=event.get("world")) if owner else ""
        if kind == vocab.AGENT_UPDATED:
            return partial("_agent_meta.html", role, agent=agent, world_id=event.get("world")) + config
        status = views.status_view({"agent": agent["name"], "state": vocab.IDLE})
        return partial("_agent.html", role, agent=agent, status=status, world_id=event.get("world")) + config
    if kind == vocab.AGENT_REMOVED:
        return delete(f"agent-{event.get('name')}") + (delete(f"agent-config-{event.get('name')}") if owner else "")
    if kind in (vocab.CHAT_CREATED, vocab.CHAT_BRANCHED):
        return partial("_chat_link.html", role, chat=event["chat"], current=None, world_id=event.get("world"))
    if kind == vocab.CHAT_RENAMED:
        return partial("_chat_title.html", role, chat=event["chat"])
    if kind == vocab.CHAT_DELETED:
        return delete(f"chat-{event.get('chat_id')}")
    if kind == vocab.WORLD_UPDATED:
        return partial("_world_name.html", role, name=event.get("name"))
    if kind == vocab.WORLD_DELETED:
        return toast("This world was deleted.", "error")
    if kind == vocab.RULE_ADDED and owner:
        return partial("_rule.html", role, rule=views.rule_view(event["rule"]), world_id=event.get("world"))
    if kind == vocab.GRANT_ADDED and owner:
        return partial("_grant.html", role, grant=views.grant_view(event["grant"]), world_id=event.get("world"))
    if kind == vocab.RULE_REVOKED and owner:
        return delete(f"rule-{event.get('rule_id')}")
    if kind in (vocab.GRANT_REVOKED, vocab.GRANT_EXPIRED) and owner:
        return delete(f"grant-{event.get('grant_id')}")
    if kind == vocab.INVITE_CREATED and owner and isinstance(event.get("invite"), dict):
        return partial("_invite_row.html", role, inv=shown_invite(event["invite"]), world_id=event.get("world"))
    if kind == vocab.INVITE_REVOKED and owner:
        return delete(f"invite-{event.get('invite_id')}")
    if kind in (vocab.MCP_SIGNED_IN, vocab.MCP_SIGNED_OUT) and owner:  # an OAuth server's controls, on every page
        server = {"name": event.get("server"), "signed_in": kind == vocab.MCP_SIGNED_IN}
        return partial("_mcp_sign_in.html", role, s=server, world_id=event.get("world"))
    return ""


def render_live(frame: dict[str, Any], role: str) -> tuple[str | None, str]:
    """A live (unpersisted) frame but a chunk (FragmentCache.live): (the chat it belongs to or None for every
    view, its HTML)."""
    kind = frame.get("type")
    if kind == "status":
        return None, partial("_status.html", role, status=views.status_view(frame))
    if kind == "presence":
        return None, partial("_members.html", role, members=frame.get("members") or [])
    if kind == "mcp_state" and role in vocab.CAN_MANAGE:  # only owners' pages list the MCP servers
        return None, partial("_mcp_state.html", role, s=views.mcp_state_view(frame))
    return None, ""


def render_chunk(frame: dict[str, Any], step: Step | None, joining: bool) -> str:
    """A chunk for every role: the message's shell and its whole picture for a page that does not show it
    yet (`joining`), else only what the chunk adds (web/streaming.py)."""
    if step is None:
        return ""
    return render("_chunk.html", chunk=frame, shell=joining or step.reset,
                  body=step.whole if joining else step.increment)


def usage_fragment(usage: dict[str, Any], role: str, agents: Iterable[str]) -> str:
    """The world's token usage and that of `agents`, as live fragments."""
    return partial("_world_usage.html", role, usage=usage) + "".join(
        partial("_usage.html", role, usage_agent=name, tokens=usage["agents"].get(name)) for name in agents)


def delete(dom_id: str) -> str:
    return f'<div id="{_attr(dom_id)}" hx-swap-oob="delete"></div>'


def toast(message: str, level: str = "info") -> str:
    return render("_toast.html", message=message, level=level)


def _attr(text: str) -> str:
    return (text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;"))


Key = tuple[Any, ...]


@dataclass(frozen=True)
class Plan:
    """What a fragment takes: the value of `key`, made by `make` unless cached, then `after`. `make` is
    pure (reads only what it was given): a long one may run in a thread (`FragmentCache.made`)."""
    after: str
    key: Key | None = None
    make: Callable[[], str] | None = None
    step: Step | None = None  # a chunk's: its Markdown blocks, rendered in a worker process when it is long
    whole: bool = False  # …all of them, for a page that joins


class FragmentCache:
    """A small LRU: each event is rendered once per role, each live frame once, whatever the connections.

    Only the event loop touches the cache and the streams' state; what runs in a thread is a `Plan`'s
    `make`, whose value the loop stores (pages asking for it meanwhile wait for the same one)."""

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self._items: OrderedDict[Key, Any] = OrderedDict()
        self._flights: SingleFlight[Any] = SingleFlight()
        self.streams = Streams()

    def get_or_make(self, key: Key, make: Callable[[], Any]) -> Any:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        return self._store(key, make())

    async def made(self, key: Key, make: Callable[[], Any], *, process: bool = False, light: bool = False) -> Any:
        """`get_or_make`, with `make` run in a thread (a worker process with `process`, server/offload.py:
        picklable work, whose Python would otherwise hold the GIL the loop needs; `light` work there is not
        left behind heavy work); pages asking for the same key meanwhile wait for that one run."""
        async def making() -> Any:
            if key in self._items:  # made by a run that ended while this one waited
                self._items.move_to_end(key)
                return self._items[key]
            return self._store(key, await (offload.run(make, light=light) if process else asyncio.to_thread(make)))
        return await self._flights.run(key, making)

    def _store(self, key: Key, value: Any) -> Any:
        self._items[key] = value
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def finish(self, plan: Plan) -> str:
        made: str = self.get_or_make(plan.key, plan.make) if plan.key and plan.make else ""
        return made + plan.after

    async def finish_off_loop(self, plan: Plan) -> str:
        step = plan.step
        if step is not None and plan.key not in self._items:
            # One trip to a worker for the step's blocks, however many pages show them (the step lives
            # while its key is in flight, so its id names it).
            await self._flights.run(("blocks", id(step), plan.whole), lambda: step.render_off_loop(plan.whole))
        made: str = await self.made(plan.key, plan.make) if plan.key and plan.make else ""
        return made + plan.after

    def event(self, world: str, event: vocab.Event, role: str, client_tools: frozenset[str]) -> Fragment:
        fragment: Fragment = self.get_or_make(*self.event_plan(world, event, role, client_tools))
        return fragment

    def event_plan(self, world: str, event: vocab.Event, role: str,
                   client_tools: frozenset[str]) -> tuple[Key, Callable[[], Fragment]]:
        """The key and the making of `event`'s fragment (picklable: `FragmentCache.made` may send it to
        a worker process)."""
        finished = self.streams.finish(event.get("id")) if event.get("kind") == vocab.MESSAGE else None
        streamed = finished.blocks if finished is not None else ()
        # By seq and time: after the storage lost its latest writes, a new event takes a lost one's seq.
        key = ("event", world, event["seq"], event.get("ts"), role)
        return key, functools.partial(render_event, event, role, client_tools, streamed)

    def live_plan(self, world: str, text: str, frame: dict[str, Any], role: str,
                  shown: dict[str, int] | None = None) -> tuple[str | None, Plan]:
        """A live frame (parsed from `text`), keyed by its exact bus text: the same string reaches every page.

        A chunk is applied to its message once, here on the loop (whatever the pages and roles); `shown`:
        how much of each streaming message the page shows (updated), None for a page that has seen every
        chunk so far."""
        if frame.get("type") != "chunk":
            chat, html = self.get_or_make(("live", world, text, role), lambda: render_live(frame, role))
            return chat, Plan(html)
        step: Step | None = self.get_or_make(("step", world, text), lambda: self.streams.step(frame))
        if step is None:
            return frame.get("chat"), Plan("")
        status: str = self.get_or_make(("streaming", world, frame.get("agent"), role), lambda: partial(
            "_status.html", role, status=views.status_view({"agent": frame.get("agent")}, streaming=True)))
        if shown is None:
            joining = step.first
        else:
            before = shown.get(step.message_id)
            if before is not None and step.end <= before and not step.reset:
                return frame.get("chat"), Plan(status)  # the page got this with the whole message (it opened since)
            joining = before is None
            shown[step.message_id] = step.end
        return frame.get("chat"), Plan(status, ("chunk", world, text, joining),
                                       lambda: render_chunk(frame, step, joining), step, joining)

    def live(self, world: str, text: str, frame: dict[str, Any], role: str,
             shown: dict[str, int] | None = None) -> tuple[str | None, str]:
        chat, plan = self.live_plan(world, text, frame, role, shown)
        return chat, self.finish(plan)
