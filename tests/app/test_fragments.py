"""Every event kind the engine can emit, and every live frame, rendered into its page fragment for each
role, checked with an HTML parser: tags balanced, ids unique, no template syntax left over (issue #14).

In-process and fast: no server. The events have the shapes the engine writes (server/engine/*,
docs/protocol.md §3, §4, §8); a new EventKind without an example here fails
`test_the_corpus_has_every_event_kind`.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
from html import unescape
from html.parser import HTMLParser
from typing import Any

import pytest
from pygments.lexers import find_lexer_class, find_lexer_class_by_name, get_all_lexers  # type: ignore[import-untyped]

from server import offload, vocab
from server.engine.public import public_off_loop
from server.vocab import EventKind
from tests.fixtures.eventually import eventually_async
from web import markdown, views
from web.markdown import render_markdown
from web.render import FragmentCache, render, render_event, role_context
from web.streaming import TAIL_MARKDOWN

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
TS = "2026-11-22T13:19:58.193Z"
ROLES = tuple(vocab.Role)


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _approval_request(call_id: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    request = {"toolCallId": call_id, "toolName": tool, "toolArguments": arguments,
               "message": f"alice wants to run {tool}", "options": list(vocab.APPROVAL_OPTIONS),
               "expiresAt": "2026-11-22T13:29:58.193Z"}
    return {"kind": "message", "id": "msg_req", "chat": "main", "agent": "alice", "sender": "server",
            "role": "assistant", "content": None, "approval": request,
            "tool_calls": [_call(f"approval_{call_id}", vocab.REQUEST_APPROVAL, request)]}


def _decision(by: str, content: dict[str, Any], **decision: Any) -> dict[str, Any]:
    return {"kind": "message", "id": f"msg_dec_{len(decision)}", "chat": "main", "agent": "alice", "sender": by,
            "role": "tool", "tool_call_id": "approval_call_1", "content": json.dumps(content),
            "decision": {"decision": content["decision"], "scope": content.get("scope"),
                         "reason": content.get("reason"), "match": content.get("match"), "tool": "shell_exec",
                         "timeout": False, **decision}}


def _result(call_id: str, name: str, content: Any, sender: str = "server") -> dict[str, Any]:
    return {"kind": "message", "id": f"msg_res_{call_id}", "chat": "main", "agent": "alice", "sender": sender,
            "role": "tool", "tool_call_id": call_id, "name": name,
            "content": content if isinstance(content, str) else json.dumps(content)}


RULE = {"id": "rule_1", "tool": "shell_exec", "match": {"command": "git status*"}, "effect": "allow",
        "reason": None, "by": "human:owner", "approval_id": None}
GRANT = {"id": "grant_1", "chat": "main", "agent": "alice", "tool": "shell_exec", "effect": "allow",
         "reason": None, "by": "human:carol", "approval_id": "approval_call_1"}
LONG = "\n".join(f"line {i} <u>not markup</u>" for i in range(40))

EXAMPLES: dict[str, dict[str, Any]] = {
    "world_created": {"kind": "world_created", "name": "Demo", "settings": {"turn_limit": 5}},
    "world_updated": {"kind": "world_updated", "name": "Renamed <u>world</u>", "settings": {"turn_limit": 8}},
    "world_deleted": {"kind": "world_deleted"},
    "agent_added": {"kind": "agent_added", "agent": {"name": "alice", "system_prompt": "You are alice.",
                                                     "provider": "scripted", "model": "demo", "base_url": None,
                                                     "tools": None}},
    "agent_updated": {"kind": "agent_updated", "agent": {"name": "alice", "model": "gpt-4o", "provider": "openai",
                                                         "tools": ["shell_exec", "file_read"]}},
    "agent_removed": {"kind": "agent_removed", "name": "bob"},
    "chat_created": {"kind": "chat_created", "chat": {"id": "ops", "title": "Ops & <i>release</i>"}},
    "chat_renamed": {"kind": "chat_renamed", "chat": {"id": "ops", "title": "Release & <i>ops</i>"}},
    "chat_deleted": {"kind": "chat_deleted", "chat_id": "ops"},
    "user": {"kind": "message", "id": "msg_u", "chat": "main", "agent": None, "sender": "human:maria",
             "role": "user", "content": "@alice please run `ls -la` and **report**", "to": ["alice"]},
    "user to no agent": {"kind": "message", "id": "msg_u0", "chat": "main", "agent": None, "sender": "human:maria",
                         "role": "user", "content": "anyone?", "to": []},
    "assistant text": {"kind": "message", "id": "msg_a", "chat": "main", "agent": "alice", "sender": "alice",
                       "role": "assistant",
                       "content": "Done:\n\n```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |",
                       "usage": {"prompt_tokens": 37, "completion_tokens": 4, "total_tokens": 41}},
    "assistant with tool calls": {
        "kind": "message", "id": "msg_tc", "chat": "main", "agent": "alice", "sender": "alice",
        "role": "assistant", "content": "Checking.",
        "tool_calls": [_call("call_1", "shell_exec", {"command": "ls -la"}),
                       _call("call_2", "file_write", {"path": "NOTES.md", "content": LONG})]},
    "assistant with a client call": {
        "kind": "message", "id": "msg_cc", "chat": "main", "agent": "alice", "sender": "alice",
        "role": "assistant", "content": None, "client_calls": ["call_3"],
        "tool_calls": [_call("call_3", "ui_notify", {"message": "hello <script>"})]},
    "assistant stopped": {"kind": "message", "id": "msg_s", "chat": "main", "agent": "alice", "sender": "alice",
                          "role": "assistant", "stopped": "stopped by maria",
                          "content": "Half a thou\n\n*(stopped by maria)*"},
    "approval request": _approval_request("call_1", "shell_exec", {"command": "rm -f build/*.o"}),
    "approval request of a redacted value": _approval_request(
        "call_4", "shell_exec", {"command": "curl -H 'Authorization: Bearer [redacted]' https://x", "n": 3}),
    "decision approve once": _decision("human:maria", {"decision": "approve", "scope": "once"}),
    "decision approve always with a match": _decision(
        "human:maria", {"decision": "approve", "scope": "always", "match": {"command": "ls *"}}),
    "decision deny with a reason": _decision("human:max", {"decision": "deny", "reason": "not on <u>my</u> watch"}),
    "decision by a rule": _decision("server", {"decision": "approve", "scope": "once"},
                                    policy={"verdict": "allow", "reason": "allowed by rule `command ~ ls *` of olivia",
                                            "rule": "rule_1"}),
    "decision timed out": _decision("server", {"decision": "deny", "reason": "timed out", "timeout": True},
                                    timeout=True),
    "tool result shell": _result("call_1", "shell_exec", {"exit_code": 0, "output": "total 8\n-rw-r--r-- a\n",
                                                          "truncated": False, "timed_out": False}),
    "tool result shell long and failing": _result("call_5", "shell_exec", {"exit_code": 2, "output": LONG,
                                                                            "truncated": True, "timed_out": False}),
    "tool result file read": _result("call_6", "file_read", {"path": "main.py", "content": "print('x')\n"}),
    "tool result JSON": _result("call_7", "mcp__lookup", {"items": [1, 2, {"k": "ü"}]}),
    "tool result text": _result("call_8", "mcp__echo", "plain text </pre> with markup <u>"),
    "tool result error": _result("call_9", "file_read", {"error": "no such file: x <y>"}),
    "tool result from a page": _result("call_3", "ui_notify", {"ok": True}, sender="human:maria"),
    "tool_started with policy": {"kind": "tool_started", "call_id": "call_1", "tool": "file_read", "agent": "bob",
                                 "chat": "main", "retry": False, "instance": "proc_1",
                                 "policy": {"verdict": "allow", "reason": "needs no approval", "default": True}},
    "tool_started retry": {"kind": "tool_started", "call_id": "call_1", "tool": "shell_exec", "agent": "bob",
                           "chat": "main", "retry": True, "instance": "proc_1"},
    "rule_added": {"kind": "rule_added", "rule": RULE},
    "rule_revoked": {"kind": "rule_revoked", "rule_id": "rule_1"},
    "grant_added": {"kind": "grant_added", "grant": GRANT},
    "grant_revoked": {"kind": "grant_revoked", "grant_id": "grant_1"},
    "grant_expired": {"kind": "grant_expired", "grant_id": "grant_1", "expires_at": "2026-01-01T00:30:00.000Z",
                      "sender": "server"},
    "refused": {"kind": "refused", "role_of_sender": "member", "code": "already_decided",
                "message": "approval_call_1 was already decided (repeated 3×)",  # noqa: RUF001 (as the engine writes it)
                "tool_call_id": "approval_call_1",
                "count": 3, "folded": True},
    "notice": {"kind": "notice", "chat": "main", "agent": "alice",
               "text": "alice reached the turn limit (5 LLM calls since the last human message) and stopped."},
    "agent_error": {"kind": "agent_error", "chat": "main", "agent": "alice",
                    "message": "alice could not answer: 401 from https://api.example/v1 <check>"},
    "turn_retried": {"kind": "turn_retried", "chat": "main", "agent": "alice", "sender": "human:max",
                     "retry_of": 7, "retry_of_id": "msg_7"},
    "invite_created": {"kind": "invite_created", "invite": {"id": "invite_1", "role": "member", "name": "carol"},
                       "invite_id": "invite_1"},
    "invite_revoked": {"kind": "invite_revoked", "invite_id": "invite_1"},
    "file_uploaded": {"kind": "file_uploaded", "chat": "main", "path": "in/<b>a&b.csv", "size": 1234,
                      "sha256": "0" * 64, "sender": "human:max", "person": "invite:invite_1"},
    "network_connection": {"kind": "network_connection", "chat": "main", "agent": "alice", "call_id": "call_1",
                           "tool": "shell_exec", "host": "<b>x</b>.example", "port": 443, "address": None,
                           "allowed": False, "reason": "denied by maria: <i>no</i>", "sent": 0, "received": 0,
                           "approval_id": "approval_call_1.net1", "sender": "server"},
    "message_edited": {"kind": "message_edited", "chat": "main", "message_id": "msg_u", "edit_of": 7,
                       "content": "@alice <b>now</b> this", "to": ["alice"], "sender": "human:maria",
                       "person": "invite:invite_1"},
    "reply_regenerated": {"kind": "reply_regenerated", "chat": "main", "agent": "alice", "sender": "human:max",
                          "person": "invite:invite_1", "reply_seq": 8, "reply_id": "msg_a", "version_of": "msg_a",
                          "version": 2},
    "chat_branched": {"kind": "chat_branched", "chat": {"id": "chat_b", "title": "Ops <i>branch</i>"},
                      "from_chat": "main", "from_seq": 8, "copied": 3, "sender": "human:max"},
    "approval_escalated": {"kind": "approval_escalated", "chat": "main", "agent": "alice",
                           "approval_id": "approval_call_1", "to": ["maria", "<b>joe</b>"], "after_minutes": 10,
                           "sender": "server"},
    "webhook_sending": {"kind": "webhook_sending", "hook": "hook_1", "target": "hooks.example.com",
                        "source_seq": 7, "subject": "request", "instance": "i1", "sender": "server"},
    "webhook_delivered": {"kind": "webhook_delivered", "hook": "hook_1", "target": "hooks.example.com",
                          "source_seq": 7, "subject": "request", "instance": "i1", "attempts": 1, "status": 200,
                          "sender": "server"},
    "webhook_failed": {"kind": "webhook_failed", "hook": "hook_1", "target": "<i>hooks</i>.example.com",
                       "source_seq": 7, "subject": "decision", "instance": "i1", "attempts": 9, "status": 500,
                       "error": "HTTP 500 <script>", "sender": "server"},
    "mcp_signed_in": {"kind": "mcp_signed_in", "server": "lin<b>ear</b>", "host": "<i>auth</i>.example.com",
                      "sender": "human:owner"},
    "mcp_signed_out": {"kind": "mcp_signed_out", "server": "lin<b>ear</b>", "revoked": True, "sender": "human:owner"},
}

LIVE: dict[str, dict[str, Any]] = {
    "chunk": {"type": "chunk", "chat": "main", "agent": "alice", "message_id": "msg_x", "delta": "**bo <b>"},
    "chunk reset": {"type": "chunk", "chat": "main", "agent": "alice", "message_id": "msg_x", "delta": "x",
                    "reset": True},
    **{f"status {state}": {"type": "status", "agent": "alice", "state": state} for state in vocab.AgentState},
    "status error": {"type": "status", "agent": "alice", "state": "idle", "last_error": "401 <x>"},
    "status retry": {"type": "status", "agent": "alice", "state": "thinking", "retry": 2, "last_error": "503"},
    "status waiting for the page": {"type": "status", "agent": "alice", "state": "waiting_approval",
                                    "waiting_for": "client"},
    "presence": {"type": "presence", "members": [{"name": "maria", "role": "member"},
                                                 {"name": "sam", "role": "spectator"}]},
    "presence of nobody": {"type": "presence", "members": []},
}


def _event(name: str, seq: int) -> dict[str, Any]:
    return {"world": "demo", "ts": TS, "seq": seq, "sender": "human:owner", **EXAMPLES[name]}


class Structure(HTMLParser):
    """Open elements as a stack: an end tag that does not close the innermost open element is an error."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids += [v or "" for k, v in attrs if k == "id"]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids += [v or "" for k, v in attrs if k == "id"]

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            self.errors.append(f"</{tag}> closes a void element")
        elif not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> while {self.stack} are open")
        else:
            self.stack.pop()


def check_structure(html: str, what: str) -> Structure:
    parser = Structure()
    parser.feed(html)
    parser.close()
    assert not parser.errors, f"{what}: {parser.errors}\n{html}"
    assert not parser.stack, f"{what}: never closed: {parser.stack}\n{html}"
    duplicated = {i for i in parser.ids if parser.ids.count(i) > 1}
    assert not duplicated, f"{what}: duplicated ids {duplicated}\n{html}"
    assert "" not in parser.ids, f"{what}: an empty id\n{html}"
    for leftover in ("{{", "}}", "{%", "%}", "None"):
        assert leftover not in html, f"{what}: {leftover!r} left in the fragment\n{html}"
    return parser


def test_the_corpus_has_every_event_kind() -> None:
    assert {e["kind"] for e in EXAMPLES.values()} == set(EventKind)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_event_renders_into_a_well_formed_fragment(name: str, role: str) -> None:
    fragment = render_event(_event(name, 42), role, frozenset({"ui_notify"}))
    for view, html in (("its chat", fragment.for_view(fragment.chat or "main")), ("another chat",
                                                                                 fragment.for_view("elsewhere"))):
        check_structure(html, f"{name} as {role} in {view}")
        assert 'id="seq" data-seq="42"' in html  # every frame ends with the page's new last seq


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", list(LIVE))
def test_every_live_frame_renders_into_a_well_formed_fragment(name: str, role: str) -> None:
    frame = LIVE[name]
    _, html = FragmentCache().live("w", json.dumps(frame), frame, role)
    assert html, f"{name} renders nothing"
    check_structure(html, f"{name} as {role}")


def test_a_renamed_world_renders_its_new_name_escaped() -> None:
    html = render_event(_event("world_updated", 30), "member", frozenset()).in_view
    assert '<h1 id="world-name" hx-swap-oob="true">Renamed &lt;u&gt;world&lt;/u&gt;</h1>' in html


@pytest.mark.parametrize("name", [n for n, e in EXAMPLES.items() if e["kind"] in ("message", "notice", "agent_error",
                                                                                   "tool_started")])
def test_each_conversation_event_is_an_article_or_fills_in_its_calls_step(name: str) -> None:
    event = _event(name, 7)
    html = render_event(event, "member", frozenset({"ui_notify"})).in_view
    if views.step_part(event) is None and views.conversation_item(event) is not None:
        assert html.count("<article ") == 1, html
        assert 'data-append-to="#log-main"' in html
    elif views.step_part(event) is not None:
        assert "<article " not in html, html
        ids = check_structure(html, name).ids
        assert [i for i in ids if i.startswith("step-")], f"{name} fills in no step: {html}"


STEP = ["assistant with tool calls", "approval request", "decision approve once", "tool result shell"]


class _Extent(HTMLParser):
    """Where the element with a given id starts and ends in a piece of HTML (character offsets)."""

    def __init__(self, element_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.element_id, self.depth, self.start, self.end = element_id, 0, -1, -1
        self.lines: list[int] = []

    def _offset(self) -> int:
        line, col = self.getpos()
        return self.lines[line - 1] + col

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.start < 0 and ("id", self.element_id) in attrs:
            self.start, self.depth = self._offset(), 1
        elif self.start >= 0 and self.end < 0 and tag not in VOID:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self.start >= 0 and self.end < 0:
            self.depth -= 1
            if self.depth == 0:
                self.end = self._offset() + len(f"</{tag}>")

    def find(self, html: str) -> tuple[int, int]:
        self.lines = [0]
        for line in html.splitlines(keepends=True):
            self.lines.append(self.lines[-1] + len(line))
        self.feed(html)
        self.close()
        return self.start, self.end


def swap_oob(page: str, fragment: str) -> str:
    """What htmx does with a fragment's `hx-swap-oob="true"` elements: each replaces the page's element of its id."""
    for element_id in re.findall(r'<\w+ id="([^"]+)"[^>]*hx-swap-oob="true"', fragment):
        start, end = _Extent(element_id).find(fragment)
        new = fragment[start:end].replace(' hx-swap-oob="true"', "")
        at, until = _Extent(element_id).find(page)
        if at >= 0:
            page = page[:at] + new + page[until:]
    return page


def test_the_first_page_folds_a_calls_events_into_its_step_as_the_live_page_swaps_them_in() -> None:
    events = [_event(name, seq) for seq, name in enumerate(STEP, start=10)]
    items = views.conversation([i for e in events if (i := views.conversation_item(e))])
    assert [i["type"] for i in items] == ["agent"]  # one article: the call's approval, decision and result are in it
    first_page = render("_item.html", item=items[0], oob=False, world_id="demo", **role_context("member"))
    check_structure(first_page, "the folded step")
    assert "approved by maria" in first_page and "exit 0" in first_page and "total 8" in first_page
    assert '<details id="step-call_1" class="step">' in first_page  # a finished step is folded

    live = render_event(events[0], "member", frozenset()).in_view.replace(' hx-swap-oob="true"', "", 1)
    live = live.split('<div id="seq"')[0]
    assert '<details id="step-call_1" class="step" open>' in live  # open while pending
    for event in events[1:]:
        live = swap_oob(live, render_event(event, "member", frozenset()).in_view)
    live = live.replace(' data-append-to="#log-main"', "").replace('data-seq="10"', 'data-seq="10"')
    # The same partials in both: after the live swaps the step reads exactly as the first page renders it
    # (only `open`, which app.js takes away when the result arrives, differs).
    assert live.replace('class="step" open>', 'class="step">', 1) == first_page


def test_agent_text_and_markup_in_arguments_arrive_as_text_everywhere() -> None:
    for name in EXAMPLES:
        html = render_event(_event(name, 9), "owner", frozenset({"ui_notify"})).in_view
        for tag in ("<script", "<u>", "<i>", "<y>", "<check>"):
            assert tag not in html, f"{name}: {tag} was not escaped\n{html}"


def _chunks(*deltas: str, message: str = "msg_s") -> list[dict[str, Any]]:
    frames, at = [], 0
    for delta in deltas:
        frames.append({"type": "chunk", "chat": "main", "agent": "alice", "message_id": message, "delta": delta,
                       "at": at})
        at += len(delta)
    return frames


def _streamed(cache: FragmentCache, frames: list[dict[str, Any]], shown: dict[str, int] | None = None,
              role: str = "member") -> list[str]:
    return [cache.live("w", json.dumps(f), f, role, shown)[1] for f in frames]


def test_a_streaming_message_commits_each_finished_markdown_block_once_and_renders_the_short_open_one() -> None:
    cache = FragmentCache()
    frames = _chunks("Here is **bold** and <script>x</script>:\n\n", "```python\nprint('hi')\n", "```\n\nafter")
    pages: dict[str, dict[str, int]] = {role: {} for role in ROLES}  # one page of each role, from the start
    html = [cache.live("w", json.dumps(f), f, role, pages[role])[1] for f in frames for role in ROLES][::len(ROLES)]
    for piece in html:
        check_structure(piece, "a streamed chunk")
    # The first paragraph is not known to be finished yet: it is the open block, in a new shell, as
    # Markdown (it is short), with no raw ** and no live markup.
    assert "<article " in html[0] and "<script" not in html[0]
    assert ('innerHTML:#tail-msg_s"><div class="md-open"><p>Here is <strong>bold</strong> and '
            '&lt;script&gt;x&lt;/script&gt;:</p>') in html[0]
    # The fence starts a new block: the paragraph is committed and appended; the open fence shows as code
    # already (closed for now), with no bare ```.
    assert "<article " not in html[1]
    assert 'beforeend:#blocks-msg_s"><p>Here is <strong>bold</strong> and &lt;script&gt;x&lt;/script&gt;:</p>' \
        in html[1]
    assert ('innerHTML:#tail-msg_s"><div class="md-open"><pre class="highlight"><code class="language-python">'
            in html[1])
    assert "```" not in html[1]
    # The fence closed and another block began: the code is committed, "after" is the open block.
    assert 'beforeend:#blocks-msg_s"><pre class="highlight"><code class="language-python"><span class="nb">print' \
        in html[2]
    assert "<strong>" not in html[2] and 'innerHTML:#tail-msg_s"><div class="md-open"><p>after</p>' in html[2]


def test_a_long_open_block_is_appended_to_as_text_until_it_ends() -> None:
    """Past TAIL_MARKDOWN characters the open block is no longer rendered with each chunk (that would cost
    what the block holds, a chunk): the page appends each delta as text, until the block is committed."""
    cache = FragmentCache()
    line = "word " * 20 + "\n"
    count = TAIL_MARKDOWN // len(line) + 2
    html = _streamed(cache, _chunks("```\n", *[line] * count, "```\n\nnext"), {})
    crossing = next(i for i, piece in enumerate(html) if 'innerHTML:#tail-msg_s">```' in piece)
    assert all('innerHTML:#tail-msg_s"><div class="md-open">' in piece for piece in html[1:crossing])
    assert 'beforeend:#tail-msg_s">word word' in html[crossing + 1]  # the delta alone, as text
    assert 'beforeend:#blocks-msg_s"><pre><code>word' in html[-1]  # ended: rendered once, as Markdown


def test_a_page_that_joins_mid_stream_gets_the_blocks_so_far_and_the_open_tail() -> None:
    cache = FragmentCache()
    frames = _chunks("One.\n\nTwo", " and more.\n\n- a\n", "- b")
    _streamed(cache, frames[:2], {})  # another page, there from the start
    joined = _streamed(cache, frames[2:], {})[0]
    check_structure(joined, "a joining page's chunk")
    assert "<article " in joined
    assert 'innerHTML:#blocks-msg_s"><p>One.</p>\n<p>Two and more.</p>\n</div>' in joined
    assert 'innerHTML:#tail-msg_s"><div class="md-open"><ul>\n<li>a</li>\n<li>b</li>\n</ul>\n</div></div>' in joined


def test_the_streamed_text_is_applied_once_whatever_the_connections_and_reset_by_a_retry() -> None:
    cache = FragmentCache()
    one, two = _chunks("ab ", "cd ")
    pages: dict[str, dict[str, int]] = {role: {"msg_s": 0} for role in ROLES}  # shown the stream from its start
    first, again = ('<div hx-swap-oob="innerHTML:#tail-msg_s"><div class="md-open"><p>ab</p>\n</div></div>',
                    '<div hx-swap-oob="innerHTML:#tail-msg_s"><div class="md-open"><p>ab cd</p>\n</div></div>')
    assert [cache.live("w", json.dumps(f), f, role, pages[role])[1].split("<span")[0]
            for f, role in ((one, "member"), (one, "owner"), (two, "member"), (two, "spectator"))] == [
        first, first, again, again]
    reset = _streamed(cache, [{**one, "delta": "", "reset": True}], pages["member"])[0]
    assert 'innerHTML:#blocks-msg_s"></div>' in reset and 'innerHTML:#tail-msg_s"></div>' in reset
    assert 'innerHTML:#tail-msg_s"><div class="md-open"><p>xy</p>' in _streamed(cache, _chunks("xy "), {})[0]
    late = {**_chunks("a", "b")[1], "message_id": "msg_joined_late"}
    html = _streamed(cache, [late], {})[0]  # this process missed the start: the page appends the delta
    assert 'hx-swap-oob="beforeend:#tail-msg_joined_late">b</div>' in html


def test_streaming_renders_each_character_of_a_long_reply_a_bounded_number_of_times(
        rendered_characters: list[int]) -> None:
    """Issue #30: a chunk costs what it adds, not the message so far (which made a 300 KB reply stall the
    server for seconds). Counted where the Markdown renderer is entered, for two pages of two roles."""
    block = "A paragraph with **bold** and `code`.\n\n```python\nx = [1, 2]\n```\n\n- one\n- two\n\n"
    reply = "".join(f"{i}. {block}" for i in range(400))
    deltas = [reply[i:i + 40] for i in range(0, len(reply), 40)]
    cache = FragmentCache()
    for frame in _chunks(*deltas):
        for role in ("member", "spectator"):  # two pages that have seen the stream from its start
            cache.live("w", json.dumps(frame), frame, role)
    assert sum(rendered_characters) <= 2 * len(reply), \
        f"{sum(rendered_characters)} characters rendered for a reply of {len(reply)}"


def test_code_blocks_are_highlighted_on_the_server_and_unknown_languages_stay_plain() -> None:
    html = render_markdown("```python\nx = '<b>'\n```\n\n```nosuchlang\n<i>raw</i>\n```")
    assert '<span class="n">x</span>' in html and "&lt;b&gt;" in html
    assert "<pre><code class=\"language-nosuchlang\">&lt;i&gt;raw&lt;/i&gt;\n</code></pre>" in html


async def test_a_streaming_code_block_is_shown_plain_until_its_lexer_is_ready_off_the_loop() -> None:
    # A lexer's first use compiles its regular expressions: 20-45 ms of the event loop for Python's, while
    # every world waited. A streaming block (rendered on the loop with each chunk) waits for a thread's.
    fence = "```fortran\nprogram hello\n  print *, 'hi'\nend program hello\n"
    first = markdown.render_open_block(fence)
    assert 'class="highlight"' not in first and "program hello" in first
    await eventually_async(lambda: 'class="highlight"' in markdown.render_open_block(fence),
                           what="the fence highlighted once its lexer was warmed up in a thread")


async def test_a_frame_naming_a_language_not_yet_used_waits_for_its_lexer_to_warm_up_in_a_thread() -> None:
    frame = json.dumps({"type": "chunk", "delta": "Here:\n```erlang\n-module(hello).\n"})  # as the bus has it
    assert markdown.lexers_warming(json.dumps({"delta": "no fence, or ```nosuchlang\n"})) == []
    warming = markdown.lexers_warming(frame)  # what a page's writer awaits before making the frame (web/live.py)
    assert len(warming) == 1 and markdown.lexers_warming(frame) in (warming, [])  # one warm-up, whoever asks
    await asyncio.wait_for(asyncio.wrap_future(warming[0]), 30)
    assert markdown.lexers_warming(frame) == []


async def test_a_message_rendered_for_good_is_highlighted_even_at_its_lexers_first_use() -> None:
    assert 'class="highlight"' in render_markdown("```cobol\n       IDENTIFICATION DIVISION.\n```\n")


def test_a_streaming_code_block_rendered_off_the_loop_is_highlighted_at_once() -> None:
    assert 'class="highlight"' in markdown.render_open_block("```ada\nprocedure Hello is\n")


def test_a_human_message_says_whom_it_went_to_or_that_it_reached_no_agent() -> None:
    to_alice = render_event(_event("user", 5), "member", frozenset()).in_view
    assert '<span class="to">to alice</span>' in to_alice and "No agent is addressed" not in to_alice
    nobody = render_event(_event("user to no agent", 6), "member", frozenset()).in_view
    assert "No agent is addressed: mention one, or add an agent." in nobody and 'class="to"' not in nobody


def test_an_unnamed_invite_shows_its_guest_name_in_the_live_row_as_in_the_list() -> None:
    # The list (`Invites.list`) says `guest-xxxx`; the row a live `invite_created` swaps in said "anyone".
    event = {"kind": "invite_created", "seq": 3, "ts": TS, "world": "w", "sender": "owner",
             "invite_id": "invite_0a1b2c3d", "invite": {"id": "invite_0a1b2c3d", "role": "member", "name": None}}
    row = render_event(event, vocab.OWNER, frozenset()).elsewhere
    assert "guest-2c3d" in row and "anyone" not in row, row


def test_a_deny_rules_empty_glob_is_shown_as_what_it_covers() -> None:
    # An empty glob is "any value or none" for an allow rule only: a deny rule `{"command": ""}` covers
    # no `rm -rf /`, and must not read as if it denied every command.
    from server.engine.approvals.policy import rule_result
    from server.tools.globs import args_covered
    deny: dict[str, Any] = {"id": "rule_1", "tool": "shell_exec", "effect": "deny", "match": {"command": ""},
                            "by": "human:ann"}
    assert args_covered(deny["match"], {"command": "rm -rf /"}) is False
    for shown in (views.rule_view(deny)["match"], rule_result(deny).reason):
        assert "any value" not in shown, shown
    allow = {**deny, "effect": "allow"}
    assert "command: any value or none" in views.rule_view(allow)["match"]


def test_an_always_decision_from_the_page_keeps_an_emptied_glob_as_any_value() -> None:
    # Dropping it (as the page once did) would now refuse that argument: a rule allows none it does not name.
    from web.live import decision_message
    message = decision_message({"approval": "approval_call_1", "choice": "approve_always",
                                "match": {"command": "git *", "timeout": ""}})
    assert json.loads(message["content"]) == {"decision": "approve", "scope": "always",
                                              "match": {"command": "git *", "timeout": ""}}


def test_an_event_the_storage_lost_is_not_shown_for_the_new_event_that_took_its_seq() -> None:
    # Redis lost the latest writes (docs/protocol.md §6 `reset`): the next event stored gets the lost one's
    # seq. The page's live stream must render the new event, not the lost one it rendered before.
    cache = FragmentCache()
    lost = {"kind": "message", "seq": 12, "id": "msg_lost", "chat": "main", "sender": "alice", "role": "user",
            "content": "the lost words", "ts": TS}
    new = {**lost, "id": "msg_new", "content": "the new words", "ts": "2026-11-22T13:25:00.000Z"}
    assert "the lost words" in cache.event("w", lost, "member", frozenset()).for_view("main")
    shown = cache.event("w", new, "member", frozenset()).for_view("main")
    assert "the new words" in shown and "the lost words" not in shown


def _summary_text(page: str, call_id: str) -> str:
    """What a step's header reads (tags out, entities decoded)."""
    at, until = _Extent(f"step-{call_id}").find(page)
    summary = page[at:until].split("<summary>", 1)[1].split("</summary>", 1)[0]
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", "", summary))).strip()


def _step_both_ways(events: list[dict[str, Any]]) -> tuple[str, str]:
    """A call's step as the first page renders it and as the live page builds it from fragments."""
    items = views.conversation([i for e in events if (i := views.conversation_item(e))])
    first_page = render("_item.html", item=items[0], oob=False, **role_context("member"))
    live = render_event(events[0], "member", frozenset()).in_view.replace(' hx-swap-oob="true"', "", 1)
    live = live.split('<div id="seq"')[0]
    for event in events[1:]:
        live = swap_oob(live, render_event(event, "member", frozenset()).in_view)
    return first_page, live


def test_an_edited_calls_step_says_what_ran_and_what_was_asked() -> None:
    asked, ran = {"command": "echo build-3; rm -rf /tmp/x"}, {"command": "echo build-3"}
    events = [{**_event("assistant with tool calls", 10), "tool_calls": [_call("call_1", "shell_exec", asked)]},
              {**_event("approval request", 11), **_approval_request("call_1", "shell_exec", asked)},
              {**_event("decision approve once", 12), "sender": "human:owner",
               **_decision("human:owner", {"decision": "approve", "scope": "once"}, arguments=ran, original=asked,
                           changed=["command"])},
              {**_event("tool result shell", 13),
               "edited": {"by": "human:owner", "changed": ["command"], "arguments": ran}}]
    for page in _step_both_ways(events):
        check_structure(page, "the edited step")
        assert _summary_text(page, "call_1") == (
            "alice ran echo build-3 (edited by owner from echo build-3; rm -rf /tmp/x) · approved by owner · exit 0")


def test_a_denied_calls_step_says_who_denied_it_never_ran() -> None:
    asked = {"command": "rm -rf /"}
    by_person = [{**_event("assistant with tool calls", 10), "tool_calls": [_call("call_1", "shell_exec", asked)]},
                 {**_event("approval request", 11), **_approval_request("call_1", "shell_exec", asked)},
                 {**_event("decision deny with a reason", 12), "reason": None},
                 {**_event("tool result error", 13), **_result("call_1", "shell_exec", {"error": "denied by max"}),
                  "not_run": "denied"}]
    reason = "denied by rule `rm *` of owner"
    by_rule = [by_person[0], {**by_person[3], "policy": {"verdict": "deny", "reason": reason, "rule_id": "rule_1"},
                              "content": json.dumps({"error": reason})}]
    for events, says in ((by_person, "alice asked to run rm -rf / · denied by max · not run"),
                         (by_rule, f"alice asked to run rm -rf / · {reason} · not run")):
        for page in _step_both_ways(events):
            check_structure(page, "the denied step")
            assert _summary_text(page, "call_1") == says


async def test_a_long_fragment_is_made_once_in_a_thread_while_other_pages_wait_for_it() -> None:
    cache, release, makers = FragmentCache(), threading.Event(), []

    def make() -> str:
        makers.append(threading.get_ident())
        release.wait(30)  # held until every page asks for it
        return "<p>long</p>"

    pages = [asyncio.create_task(cache.made(("chunk", "w", "frame"), make)) for _ in range(3)]
    await asyncio.sleep(0.01)  # the first page's thread has started; the others wait on the loop
    release.set()
    assert await asyncio.gather(*pages) == ["<p>long</p>"] * 3
    assert len(makers) == 1 and makers[0] != threading.get_ident()  # once, and not on the loop's thread
    assert cache.get_or_make(("chunk", "w", "frame"), lambda: "made again") == "<p>long</p>"


async def test_a_page_cancelled_while_making_a_fragment_leaves_it_to_the_next() -> None:
    cache, release = FragmentCache(), threading.Event()
    first = asyncio.create_task(cache.made(("k",), lambda: release.wait(30) and "first"))
    await asyncio.sleep(0.01)
    waiting = asyncio.create_task(cache.made(("k",), lambda: "second"))
    await asyncio.sleep(0.01)
    first.cancel()
    release.set()
    assert await waiting == "second"  # made anew, not a cancellation it never asked for


def test_a_huge_tool_result_shows_its_start_in_the_page_and_says_where_the_rest_is() -> None:
    result = {"kind": "message", "seq": 9, "ts": TS, "world": "w", "chat": "main", "role": "tool",
              "tool_call_id": "call_big", "name": "big__big", "content": "lorem " * 500_000}
    html = render_event(result, "member", frozenset()).in_view
    check_structure(html, "a huge result's step")
    assert len(html) < 150_000  # not the 3 MB result
    assert "Only the first 100,000 of 3,000,000 characters are shown here" in html


async def test_pages_showing_the_same_long_chunk_send_its_blocks_to_a_worker_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Five pages rendered each long chunk's blocks five times over: the workers' CPU, on a two-core
    machine, was taken from every other world (bench/isolation.py)."""
    trips: list[Any] = []

    async def run(work: Any, **_: Any) -> Any:
        trips.append(work)
        await asyncio.sleep(0.01)  # a trip takes a while: the other pages ask meanwhile
        return work()
    monkeypatch.setattr(offload, "run", run)
    cache = FragmentCache()
    frame = _chunks("A paragraph with **bold**.\n\n```python\nx = 1\n```\n\n" * 40 + "the tail")[0]
    text = json.dumps(frame)
    plans = [cache.live_plan("w", text, frame, "member", {})[1] for _ in range(5)]
    pages = await asyncio.gather(*(cache.finish_off_loop(plan) for plan in plans))
    assert len({page for page in pages}) == 1 and pages[0].count('<pre class="highlight">') == 40
    assert [getattr(trip, "func", None) for trip in trips] == [markdown.render_blocks]


async def test_a_large_event_asked_for_by_many_readers_at_once_is_redacted_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bus, five pages and a reader each sent the same 16 MiB result to a worker to be redacted."""
    trips: list[Any] = []

    async def run(work: Any, **_: Any) -> Any:
        trips.append(work)
        await asyncio.sleep(0.01)
        return work()
    monkeypatch.setattr(offload, "run", run)
    key = "ghp_" + "Zx8" * 12
    event = {"kind": "message", "seq": 7, "id": "msg_large", "role": "tool", "tool_call_id": "call_1",
             "content": "lorem ipsum " * 10_000 + key}
    shown = await asyncio.gather(*(public_off_loop(event) for _ in range(6)))
    assert all(one is shown[0] for one in shown) and shown[0]["content"].endswith("[redacted]")
    assert len(trips) == 1


def test_code_fences_rendered_at_once_in_two_threads_show_only_their_own_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # Renders run in several threads; a Pygments lexer shared between them (some keep what they read, as
    # `tnt` does) put one world's code into another world's page.
    from pygments.lexers.tnt import TNTLexer  # type: ignore[import-untyped]

    first_inside, second_done = threading.Event(), threading.Event()
    original = TNTLexer.whitespace

    def whitespace(self: TNTLexer, start: int, text: str, required: bool = False) -> Any:
        if threading.current_thread().name == "first" and not first_inside.is_set():
            first_inside.set()  # the first render stops here, mid-fence, until the second has run
            second_done.wait(10)
        return original(self, start, text, required)

    monkeypatch.setattr(TNTLexer, "whitespace", whitespace)
    shown: dict[str, str] = {}
    first = threading.Thread(target=lambda: shown.update(first=markdown.render_block("```tnt\na=a\n```\n")),
                             name="first")
    first.start()
    assert first_inside.wait(10)
    shown["second"] = markdown.render_block("```tnt\nb=b\n```\n")
    second_done.set()
    first.join(10)
    assert ">b<" not in shown["first"] and ">a<" in shown["first"], shown["first"]
    assert ">a<" not in shown["second"], shown["second"]


@pytest.mark.parametrize(("lang", "code", "state"), [
    ("haxe", "#if debug\n#if trace\nvar x = 1;\n", ("haxe", "preproc_stack")),
    ("xquery", "<a>{<b>{<c>{\n", ("xquery", "xquery_parse_state")),
    ("csound", "opcode secretop, a, a\nendop\n", ("csound", "user_defined_opcodes")),
    # Lexers that other lexers make for what they hold: Csound's inside a Csound document, any inside Markdown.
    ("csound-document", "<CsInstruments>\nopcode secretop, a, a\nendop\n</CsInstruments>\n",
     ("csound", "user_defined_opcodes")),
    ("md", "```haxe\n#if debug\nvar x = 1;\n```\n", ("haxe", "preproc_stack")),
])
def test_a_fence_leaves_nothing_in_a_lexer_class_for_the_next_reply(lang: str, code: str,
                                                                    state: tuple[str, str]) -> None:
    # These lexers keep parse state in a class attribute: it grew with every render, and reached other worlds.
    lexer_class, attribute = find_lexer_class_by_name(state[0]), state[1]
    fence = f"````{lang}\n{code}````\n"  # (four: a Markdown fence may hold one of three)
    first = markdown.render_block(fence)
    for _ in range(3):
        assert markdown.render_block(fence) == first
    assert not getattr(lexer_class, attribute)


def test_an_opcode_one_reply_defines_is_not_known_in_the_next() -> None:
    # Csound highlights opcodes a fence defined (`nf`); those of another world's reply stayed known to it.
    markdown.render_block("```csound\nopcode secretop, a, a\nendop\n```\n")
    later = markdown.render_block("```csound\ninstr 1\nsecretop\nendin\n```\n")
    assert '<span class="n">secretop</span>' in later, later
    assert find_lexer_class_by_name("haxe")().preproc_stack is not find_lexer_class_by_name("haxe")().preproc_stack


def test_every_lexer_state_kept_in_a_class_attribute_is_given_to_each_lexer_apart() -> None:
    # A Pygments upgrade may add a lexer that keeps state in an empty class-level list, set or dict: found
    # here, it fails until web/markdown.py's LEXER_CLASS_STATE gives each instance its own.
    harmless = {("FoxProLexer", "mimetype"), ("TNTLexer", "cur")}  # (TNTLexer sets its own `cur` when it starts)
    metadata = {"aliases", "filenames", "alias_filenames", "mimetypes", "tokens"}
    found = set()
    for name, *_ in get_all_lexers(plugins=False):
        for klass in find_lexer_class(name).__mro__:
            if klass.__module__ == "pygments.lexer" or klass is object:
                continue  # the base classes: metadata that every lexer sets for itself
            for attribute, value in vars(klass).items():
                if isinstance(value, (list, set, dict)) and not value and attribute not in metadata:
                    found.add((klass.__name__, attribute))
    assert found <= harmless, found - harmless  # (the ones web/markdown.py handles are no longer lists or sets)


def test_every_template_is_compiled_when_the_app_is_built_not_at_its_first_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiled at first use, on the event loop, each held every world 5-250 ms.
    from web import app as web_app
    from web.render import env

    web_app.routes()

    def no_source(*_: Any) -> Any:
        raise AssertionError("a template was compiled after the app was built")

    monkeypatch.setattr(env.loader, "get_source", no_source)
    for name in env.list_templates(extensions=["html"]):
        env.get_template(name)
