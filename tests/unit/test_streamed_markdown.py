"""A finished reply's render takes the HTML of the blocks its stream rendered (web/markdown.py,
`render_streamed`): the same HTML as rendering the whole text, at the cost of what the stream did not
render. Issue #30: each character of a 1 MB reply was rendered twice, once as it streamed and once whole."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server import vocab
from web import markdown
from web.markdown import Rendered, render_block, render_streamed
from web.render import FragmentCache, render_event
from web.streaming import Streams


def _stream(text: str, size: int) -> Rendered:
    """`text` streamed `size` characters a chunk to a page that shows each, then finished."""
    streams = Streams()
    for at in range(0, len(text), size):
        step = streams.step({"message_id": "m", "delta": text[at:at + size], "at": at})
        assert step is not None
        step.increment  # noqa: B018 (what a page is sent: renders the blocks each chunk commits)
    finished = streams.finish("m")
    return finished.blocks if finished is not None else ()


def _finished(text: str, streamed: Rendered) -> str:
    """The finished message's HTML made from `streamed` (not taken from the renders kept in this process)."""
    markdown._rendered.clear()
    return render_streamed(text, streamed).html


# Texts whose blocks, split where a stream splits them, do not all render alike on their own.
TRICKY = {
    "a loose list": "- one\n\n- two\n\n- three\n\nAfter.\n",
    "a loose ordered list": "1. one\n\n2. two\n\n10. ten\n",
    "a list item of two paragraphs": "- one\n\n  still one\n\n- two\n\nAfter.\n",
    "a nested loose list": "- a\n  - b\n\n  - c\n\n- d\n",
    "a reference defined after its use": "See [the docs][d].\n\nMore.\n\n[d]: https://example.com/d\n",
    "a reference defined in a quote": "[x]\n\n> [x]: https://example.com/x\n",
    "a fence in a list item closed at the margin": "- ```\n  code\n```\n\nafter\n\n```\nmore\n",
    "a fence closed then text at once": "```python\nx = 1\n```\nText.\n\n- a\n",
    "two quotes": "> one\n\n> two\n\nend\n",
    "a table": "| a | b |\n|---|:-:|\n| 1 | 2 |\n\nAfter the table.\n",
    "headings and rules": "Title\n=====\n\n* * *\n\n# H1\n\n---\n\nSub\n---\n",
    "indented code after a paragraph": "Para.\n\n    code\n\n    more code\n\nEnd.\n",
    "leading blank lines": "\n\n  \nFirst.\n\nSecond.\n",
    "CRLF line ends": "One.\r\n\r\n- a\r\n\r\n- b\r\n",
    "an unclosed fence": "Intro.\n\n~~~\ncode\n\nstill code\n",
    "markup and a script": "<b>x</b> <script>alert(1)</script>\n\n[a](javascript:alert(1))\n\n![i](http://e/i)\n",
    "a NUL": "a\0b\n\nc\n",
    "blank-looking lines that are not blank": "Para.\n\n\u00a0\n\n\x0c\n\n\u2028\n\nEnd\n\n\x1c",
}


@pytest.mark.parametrize("size", [1, 3, 17, 64, 10_000])
@pytest.mark.parametrize("name", list(TRICKY))
def test_a_finished_reply_renders_as_its_whole_text_would_however_it_streamed(name: str, size: int) -> None:
    text = TRICKY[name]
    assert _finished(text, _stream(text, size)) == render_block(text)


def test_the_block_parse_knows_every_block_the_renderer_makes() -> None:
    """`render_streamed` reads where blocks start and end from a second parser: it must find the same."""
    assert markdown._block_md.get_active_rules()["block"] == markdown._md.get_active_rules()["block"]
    assert markdown._block_md.options["maxNesting"] == markdown._md.options["maxNesting"]


def test_a_loose_list_streamed_as_separate_blocks_is_one_loose_list_when_finished() -> None:
    text = TRICKY["a loose list"]
    streamed = _stream(text, 4)
    assert len(streamed) >= 3  # the stream rendered each item as a list of its own
    html = _finished(text, streamed)
    assert html.count("<ul>") == 1 and html.count("<p>") == 4


_LINES = st.sampled_from(["", "", "Text with *em* and `code`.", "- item", "  - nested", "1. first", "2) second",
                          "  indented", "    code", "> quote", "```", "```py", "~~~", "# Heading", "===", "---",
                          "* * *", "| a | b |", "|---|---|", "[ref]: https://e.x", "[ref]", "\t- tab", "<div>",
                          "\u00a0", "\x0c", "\u2028", " \t "])


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LINES, max_size=30), size=st.integers(1, 40))
def test_any_text_finished_after_streaming_renders_as_its_whole_text(lines: list[str], size: int) -> None:
    text = "\n".join(lines) + "\n"
    assert _finished(text, _stream(text, size)) == render_block(text)


def test_a_finished_reply_takes_each_block_its_stream_rendered_and_renders_only_the_rest(
        rendered_characters: list[int]) -> None:
    block = "A paragraph with **bold** and `code`.\n\n```python\nx = [1, 2]\n```\n\n- one\n- two\n\n"
    reply = "".join(f"Part {i}. {block}" for i in range(300)) + "The last line."
    cache, shown = FragmentCache(), dict[str, int]()  # one page, there from the start
    for at in range(0, len(reply), 50):
        frame = {"type": "chunk", "chat": "main", "agent": "alice", "message_id": "msg_r",
                 "delta": reply[at:at + 50], "at": at}
        cache.live("w", json.dumps(frame), frame, "member", shown)
    rendered_characters.clear()
    event = {"kind": vocab.MESSAGE, "seq": 9, "id": "msg_r", "chat": "main", "agent": "alice",
             "sender": "alice", "role": "assistant", "content": reply}
    markdown._rendered.clear()
    fragment = cache.event("w", event, "member", frozenset())
    assert sum(rendered_characters) == len("The last line.")  # the block the stream had not finished
    cache.event("w", event, "spectator", frozenset())  # another role's page: its HTML made already
    assert sum(rendered_characters) == len("The last line.")
    markdown._rendered.clear()
    assert fragment.in_view == render_event(event, "member", frozenset()).in_view  # as when rendered whole


def test_a_reply_stored_unlike_its_stream_is_rendered_from_where_they_part() -> None:
    streamed = _stream("One.\n\nTwo.\n\nThree.\n\nFour", 5)
    stored = "One.\n\nTwo, amended.\n\nThree.\n\nFour."
    assert _finished(stored, streamed) == render_block(stored)


def _watched(reply: str, message: str = "msg_k", size: int = 40) -> tuple[FragmentCache, dict[str, int]]:
    """`reply` streamed to one page of a member, there from the start."""
    cache, shown = FragmentCache(), dict[str, int]()
    for at in range(0, len(reply), size):
        frame = {"type": "chunk", "chat": "main", "agent": "alice", "message_id": message,
                 "delta": reply[at:at + size], "at": at}
        cache.live("w", json.dumps(frame), frame, "member", shown)
    return cache, shown


def _stored(reply: str, message: str = "msg_k") -> vocab.Event:
    return {"kind": vocab.MESSAGE, "seq": 9, "id": message, "chat": "main", "agent": "alice", "sender": "alice",
            "role": "assistant", "content": reply}


def test_a_page_that_showed_every_streamed_block_keeps_them_and_is_sent_only_what_follows() -> None:
    """The finished article keeps the page's blocks as they are (no second copy of a long reply on the
    wire, nothing re-parsed, a selection in them kept) and appends the last block."""
    reply = "".join(f"Part {i}: a paragraph with **bold**.\n\n```python\nx = {i}\n```\n\n" for i in range(50)) + "End."
    cache, shown = _watched(reply)
    event = _stored(reply)
    fragment = cache.event("w", event, "member", frozenset())
    view = fragment.for_view("main", kept=cache.streams.kept("msg_k", shown))
    assert '<div id="blocks-msg_k" class="md" hx-preserve="true"></div>' in view
    assert '<div hx-swap-oob="beforeend:#blocks-msg_k"><p>End.</p>\n</div>' in view
    assert "Part 0" not in view and len(view) < len(fragment.in_view) / 5
    assert "Part 0" in fragment.for_view("main") and "hx-preserve" not in fragment.in_view  # for other pages


def test_a_page_sent_part_of_the_stream_gets_the_whole_finished_article() -> None:
    reply = "One.\n\nTwo.\n\nThree."
    cache, shown = _watched(reply, size=3)
    shown["msg_k"] -= 3  # as if the last chunk had not been sent to it
    cache.event("w", _stored(reply), "member", frozenset())
    assert not cache.streams.kept("msg_k", shown)
    assert cache.streams.kept("msg_k", {**shown, "msg_k": len(reply)})  # (a page sent all of it would)


def test_blocks_that_render_otherwise_in_the_whole_text_are_not_kept() -> None:
    """A loose list streams as lists of one item each: the finished article replaces them."""
    reply = "- one\n\n- two\n\n- three\n\nAfter."
    cache, shown = _watched(reply, size=4)
    fragment = cache.event("w", _stored(reply), "member", frozenset())
    assert cache.streams.kept("msg_k", shown) and fragment.kept_view is None
    assert fragment.for_view("main", kept=True) == fragment.in_view


def test_a_reply_of_the_same_text_streamed_in_fewer_blocks_is_sent_what_follows_its_own() -> None:
    """Two replies of one text: the second was stopped before its last lines were streamed (they are
    stored all the same), so its page holds one block where the first's held two."""
    text = "One.\n\nTwo.\n\nThree."
    first, shown = _watched(text, "msg_a")
    assert "<p>Three.</p>" in first.event("w", _stored(text, "msg_a"), "member", frozenset()).for_view(
        "main", kept=first.streams.kept("msg_a", shown))
    second, shown = _watched("One.\n\nTwo.", "msg_b")
    fragment = second.event("w", _stored(text, "msg_b"), "member", frozenset())
    view = fragment.for_view("main", kept=second.streams.kept("msg_b", shown))
    assert "hx-preserve" in view and '"beforeend:#blocks-msg_b"><p>Two.</p>\n<p>Three.</p>' in view
