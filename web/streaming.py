"""A streaming reply rendered as it comes, at the cost of what each chunk adds.

Each streaming message keeps its text from the last committed block boundary on (`_Message`). Only the
lines a chunk completes are looked at (tracking whether a code fence is open); a blank line outside a
fence, or a closing fence, ends a Markdown block once the next block starts (a line that begins
unindented). The ended block is rendered as Markdown once and appended to the page. The block still
open is rendered as Markdown with each chunk while it is short (TAIL_MARKDOWN: a bounded cost a chunk,
and no bare ``` or ** while a paragraph or a code block streams); past that it is shown as plain text,
appended to with each delta, until it ends.

Everything here is the same for every role and page: one `Step` per bus frame (FragmentCache keys it by
the frame's text). A page that has not shown a message yet (it joined mid-stream, or reconnected) gets the
whole picture at that frame (`Step.whole`: the blocks so far and the open tail); the others get
`Step.increment`. The finished message (the stored event) replaces all of it: its render takes the blocks'
HTML from here where it is the same (web/markdown.py, `render_streamed`), so a committed block is not
rendered again, and a page that was sent every chunk keeps the blocks it shows (`Finished.kept_by`).

Threads: `Streams.step` changes state and runs on the event loop, in the frames' order; it only scans
and splits. The Markdown is rendered by `Step.increment` and `Step.whole`, which read what their step
captured and may run in a thread (a long chunk is rendered off the loop, server/api/live/stream.py).
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

from markupsafe import Markup, escape

from server import offload

from .markdown import Rendered, render_block, render_blocks, render_open_block

TAIL_MARKDOWN = 2048  # characters of the open block rendered as Markdown with each chunk; longer: as text
FINISHED = 4  # finished messages whose rendered blocks are kept for the pages' roles still to render them
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})")
_FENCE_CLOSE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*\r?\Z")
_INDENT = " \t\r"


@dataclass
class _Message:
    """One message's stream in this process: its committed blocks and the text after them."""
    blocks: list[str] = field(default_factory=list)  # the committed blocks' Markdown, in order
    html: dict[int, Markup] = field(default_factory=dict)  # blocks rendered so far, by index
    parts: list[str] = field(default_factory=list)  # the text from `base` on, as it came (joined at commits)
    base: int = 0  # where the uncommitted text starts
    length: int = 0  # characters received
    line: list[str] = field(default_factory=list)  # the line not yet ended
    fence: str | None = None  # the marker of the open code fence
    boundary: int | None = None  # where the next block may start (after a blank line or a closing fence)
    last: tuple[dict[str, Any], Step] | None = None  # the latest chunk applied, for a page that opens now

    def feed(self, delta: str) -> bool:
        """Take the next delta; whether blocks were committed."""
        cuts: list[int] = []  # block boundaries met in this delta, rendered together after the scan
        start = 0
        while start < len(delta):
            end = delta.find("\n", start)
            piece = delta[start:] if end < 0 else delta[start:end]
            if piece and not self.line and self.boundary is not None and piece[0] not in _INDENT:
                cuts.append(self.boundary)  # the line starting here begins a new block
                self.boundary = None
            self.line.append(piece)
            if end < 0:
                break
            self._line_ended("".join(self.line), self.length + end + 1)
            self.line = []
            start = end + 1
        self.parts.append(delta)
        self.length += len(delta)
        if cuts:
            self._commit(cuts)
        return bool(cuts)

    def finished(self) -> Finished:
        """The blocks rendered so far, in order from the first (up to the first that was not)."""
        out = []
        for i, block in enumerate(self.blocks):
            if i not in self.html:
                break
            out.append((block, self.html[i]))
        return Finished(tuple(out), self.length, len(out) == len(self.blocks))

    def _line_ended(self, line: str, after: int) -> None:
        if self.fence is not None:
            closing = _FENCE_CLOSE.match(line)
            if closing and closing.group(1)[0] == self.fence[0] and len(closing.group(1)) >= len(self.fence):
                self.fence, self.boundary = None, after
            return
        opening = _FENCE_OPEN.match(line)
        if opening and not (opening.group(1)[0] == "`" and "`" in line[opening.end():]):
            self.fence, self.boundary = opening.group(1), None
        elif not line.strip():
            self.boundary = after

    def _commit(self, cuts: list[int]) -> None:
        """Split the text between the boundaries into blocks (one join; rendered by the Steps)."""
        text = "".join(self.parts)
        at = 0
        for cut in cuts:
            block = text[at:cut - self.base]
            at = cut - self.base
            if block.strip():
                self.blocks.append(block)
        rest = text[at:]
        self.parts = [rest] if rest else []  # a new list: earlier Steps keep theirs
        self.base = cuts[-1]


@dataclass(frozen=True)
class Finished:
    """What a stored message's stream rendered in this process: its blocks rendered, from the first on
    (`every`: all that it committed), and how many characters came."""
    blocks: Rendered
    length: int
    every: bool

    def kept_by(self, shown: int | None) -> bool:
        """Whether a page sent `shown` characters of the stream shows every block this holds, and only them
        (web/render.py, `Fragment.kept_view`)."""
        return bool(self.blocks) and self.every and shown == self.length


@dataclass
class Step:
    """What one chunk frame changes: `increment` for pages that show the message, `whole` for a page
    that does not yet. `message` is None when the frame is not a chunk this process can place."""
    message_id: str
    delta: str
    reset: bool = False
    missed: bool = False  # this process missed a part: the delta is appended as text
    stale: bool = False  # a frame applied before (its Step was dropped from the cache)
    first: bool = False  # the message's first chunk in this process
    end: int = 0  # where the message's text ends after this chunk
    state: _Message | None = None
    blocks_before: int = 0
    blocks_after: int = 0
    tail_parts: list[str] = field(default_factory=list)
    tail_count: int = 0
    tail_length: int = 0  # characters of the open block after this chunk
    committed: bool = False

    def _tail(self) -> str:
        return "".join(self.tail_parts[:self.tail_count])

    def _tail_html(self) -> Markup:
        """The open block: as Markdown while it is short, else as text (see TAIL_MARKDOWN)."""
        if self.tail_length > TAIL_MARKDOWN:
            return escape(self._tail())
        # `md-open`, not `md`: one Markdown body a message (what a copy takes, what readers look for)
        return Markup('<div class="md-open">') + render_open_block(self._tail()) + Markup("</div>")

    async def render_off_loop(self, whole: bool) -> None:
        """Render the blocks this step shows (all of them for a page that joins: `whole`) in a worker
        process, so that `increment` and `whole` only join them: Markdown and Pygments hold the GIL."""
        if self.state is None:
            return
        done = self.state.html
        todo = [i for i in range(0 if whole else self.blocks_before, self.blocks_after) if i not in done]
        if todo:
            texts = tuple(self.state.blocks[i] for i in todo)
            light = sum(map(len, texts)) <= offload.HEAVY  # (a page waits for it: not behind heavy work)
            for i, html in zip(todo, await offload.run(partial(render_blocks, texts), light=light), strict=True):
                done.setdefault(i, html)

    def _blocks(self, start: int, end: int) -> Markup:
        """Blocks `start` to `end` as HTML, each rendered once whoever asks (the same Markup again)."""
        assert self.state is not None
        done = self.state.html
        for i in range(start, end):
            if i not in done:
                done[i] = render_block(self.state.blocks[i])
        return Markup("").join(done[i] for i in range(start, end))

    @cached_property
    def increment(self) -> Markup:
        m = escape(self.message_id)
        if self.reset or self.state is None:
            return self.whole
        if self.stale:
            return Markup("")
        blocks = self._blocks(self.blocks_before, self.blocks_after)
        out = Markup(f'<div hx-swap-oob="beforeend:#blocks-{m}">{blocks}</div>') if blocks else Markup("")
        if self.committed or self.tail_length - len(self.delta) <= TAIL_MARKDOWN:  # (was Markdown until now)
            return out + Markup(f'<div hx-swap-oob="innerHTML:#tail-{m}">{self._tail_html()}</div>')
        return out + Markup(f'<div hx-swap-oob="beforeend:#tail-{m}">{escape(self.delta)}</div>')

    @cached_property
    def whole(self) -> Markup:
        m = escape(self.message_id)
        if self.state is None:  # missed a part (or a reset, whose delta is ""): the page has what it has
            swap = "innerHTML" if self.reset else "beforeend"
            blocks = Markup(f'<div hx-swap-oob="innerHTML:#blocks-{m}"></div>') if self.reset else Markup("")
            return blocks + Markup(f'<div hx-swap-oob="{swap}:#tail-{m}">{escape(self.delta)}</div>')
        blocks = self._blocks(0, self.blocks_after)
        return Markup(f'<div hx-swap-oob="innerHTML:#blocks-{m}">{blocks}</div>'
                      f'<div hx-swap-oob="innerHTML:#tail-{m}">{self._tail_html()}</div>')


class Streams:
    """The streaming messages of this process (the last `size`), fed one chunk frame at a time."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._messages: OrderedDict[str, _Message] = OrderedDict()
        self._finished: OrderedDict[str, Finished] = OrderedDict()

    def step(self, frame: dict[str, Any]) -> Step | None:
        """What `frame` changes (call once per frame: FragmentCache does); None for a malformed chunk."""
        message, delta, at = frame.get("message_id"), frame.get("delta"), frame.get("at")
        if not isinstance(message, str) or not isinstance(delta, str):
            return None
        if frame.get("reset"):
            self._messages[message] = _Message()
            self._trim(message)
            return Step(message, delta, reset=True)
        state = self._messages.get(message)
        first = state is None and at == 0
        if first:
            state = self._messages[message] = _Message()
        if state is None or not isinstance(at, int) or at > state.length:
            return Step(message, delta, missed=True, end=at + len(delta) if isinstance(at, int) else 0)
        self._trim(message)
        if at < state.length:  # seen before: nothing new for the pages that show it
            return Step(message, delta, stale=True, state=state, blocks_after=len(state.blocks),
                        tail_parts=state.parts, tail_count=len(state.parts), tail_length=state.length - state.base,
                        end=state.length)
        before = len(state.blocks)
        committed = state.feed(delta)
        step = Step(message, delta, state=state, blocks_before=before, blocks_after=len(state.blocks),
                    tail_parts=state.parts, tail_count=len(state.parts), tail_length=state.length - state.base,
                    committed=committed, first=first, end=state.length)
        state.last = (frame, step)
        return step

    def finish(self, message: object) -> Finished | None:
        """The message was stored: pages opening from now on show it from the log. What its stream
        rendered, for the stored message's render to take (each role's, whichever asks first)."""
        if not isinstance(message, str):
            return None
        state = self._messages.pop(message, None)
        if state is not None:
            self._finished[message] = state.finished()
            if len(self._finished) > FINISHED:
                self._finished.popitem(last=False)
        return self._finished.get(message)

    def kept(self, message: object, shown: dict[str, int]) -> bool:
        """Whether a page that was sent `shown` of each stream shows every block of `message`'s (finished)."""
        if not isinstance(message, str):
            return False
        finished = self._finished.get(message)
        return finished is not None and finished.kept_by(shown.get(message))

    def streaming_in(self, chat: str) -> list[tuple[dict[str, Any], Step]]:
        """The latest chunk of each message streaming in `chat` (for a page that opens meanwhile)."""
        return [m.last for m in self._messages.values() if m.last is not None and m.last[0].get("chat") == chat]

    def _trim(self, message: str) -> None:
        self._messages.move_to_end(message)
        if len(self._messages) > self.size:
            self._messages.popitem(last=False)
