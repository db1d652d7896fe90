"""Markdown to safe HTML: markdown-it-py renders (raw HTML off), Pygments highlights code blocks on the
server (no script needed), nh3 sanitizes what comes out."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup, escape
from pygments import highlight  # type: ignore[import-untyped]
from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]
from pygments.lexers import find_lexer_class_by_name  # type: ignore[import-untyped]
from pygments.lexers.csound import CsoundOrchestraLexer  # type: ignore[import-untyped]
from pygments.lexers.haxe import HaxeLexer  # type: ignore[import-untyped]
from pygments.lexers.webmisc import XQueryLexer  # type: ignore[import-untyped]
from pygments.util import ClassNotFound  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)
_FORMATTER = HtmlFormatter(nowrap=True)  # token <span class="k">s; app.css colours them for both themes


@lru_cache(maxsize=64)
def _lexer_class(name: str) -> Any:
    """The lexer class for a fence's language, or None: found once per name (finding it took 14% of rendering
    a reply with many short code blocks). A lexer itself is made for each fence: some keep what they read
    (Pygments' `tnt`, `http`, `postgres`…), and renders run in several threads at once."""
    try:
        return find_lexer_class_by_name(name)
    except ClassNotFound:
        return None


class _OwnState:
    """A lexer class's parse state, made anew for each instance at its first use (kept in the instance
    from then on: a class attribute that only reads, as this one, yields to the instance's own)."""

    def __init__(self, name: str, kind: type) -> None:
        self.name, self.kind = name, kind

    def __get__(self, lexer: Any, owner: type) -> Any:
        if lexer is None:
            return self.kind()  # read from the class itself: an empty one, never shared
        state = lexer.__dict__[self.name] = self.kind()
        return state


# Parse state that these Pygments lexers keep in a class attribute, shared by every instance: by every world
# and every render thread. Haxe's `#if` stack and XQuery's state stack grew with every reply that left them
# open, for good; Csound's opcodes defined in one world's reply were highlighted in another's. Given to each
# instance apart, wherever it is made (a Markdown or Csound-document fence makes these lexers itself).
# tests/app/test_fragments.py fails when another lexer keeps such an attribute.
LEXER_CLASS_STATE: dict[Any, str] = {HaxeLexer: "preproc_stack", XQueryLexer: "xquery_parse_state",
                                     CsoundOrchestraLexer: "user_defined_opcodes"}
for _class, _name in LEXER_CLASS_STATE.items():
    _shared = vars(_class).get(_name)
    if isinstance(_shared, (list, set, dict)):  # (not when a Pygments release changed it, or already done)
        setattr(_class, _name, _OwnState(_name, type(_shared)))


# A lexer's first use in a process compiles its regular expressions: 20-45 ms of the event loop for Python's,
# while every world waited (bench/isolation.py), and a reply may name any of some 500 languages. A page's
# writer has the lexers a frame names made once in a thread first (`lexers_warming`); a block still
# streaming, rendered on the loop with each chunk, shows a fence plain until then. What is rendered for
# good is always highlighted.
_used: set[Any] = set()  # lexer classes made once in this process (their regular expressions compiled)
_first_use = threading.Lock()  # Pygments compiles into class attributes: one first use at a time
_warming: dict[Any, Future[None]] = {}
_warming_lock = threading.Lock()
_warmer = ThreadPoolExecutor(1, thread_name_prefix="lexer-warm-up")
_provisional = threading.local()  # set while rendering a streaming block
LOOP_MARKDOWN = 4 * 1024  # characters of Markdown rendered on the event loop at most (about 1.5 ms a KiB)
WARMED_PER_TEXT = 16  # languages a text may have warmed up (a reply naming hundreds waits for no more)


def _highlight(code: str, lang: str, _attrs: str) -> str:
    """A fenced block with a known language, highlighted; "" lets markdown-it escape it as it is."""
    lexer_class = _lexer_class(lang.strip().split()[0]) if lang.strip() else None
    if lexer_class is None:
        return ""
    if lexer_class not in _used and getattr(_provisional, "on", False) and _on_event_loop():
        _warm_up(lexer_class)
        return ""
    html = highlight(code, _lexer(lexer_class), _FORMATTER)
    return f'<pre class="highlight"><code class="language-{escape(lang.split()[0])}">{html}</code></pre>\n'


def _lexer(lexer_class: Any) -> Any:
    """A lexer of `lexer_class`, its first one made alone (two threads compiling one class at once could
    leave it with states named alike, mis-highlighting that language for the life of the process)."""
    if lexer_class in _used:
        return lexer_class()
    with _first_use:
        lexer = lexer_class()
    _used.add(lexer_class)
    return lexer


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


_FENCE_LANGUAGE = re.compile(r"(?:`{3,}|~{3,})[ \t]*([\w#+.-]+)")


def lexers_warming(text: str) -> list[Future[None]]:
    """The warm-ups of the lexers that code fences in `text` (Markdown, or a JSON frame holding some) name
    and this process has not made yet (the first WARMED_PER_TEXT names), started here if need be: what a
    render of `text` on the loop would otherwise compile there."""
    if "```" not in text and "~~~" not in text:
        return []
    warming = []
    for name in list(dict.fromkeys(_FENCE_LANGUAGE.findall(text)))[:WARMED_PER_TEXT]:
        lexer_class = _lexer_class(name)
        if lexer_class is not None and lexer_class not in _used:
            warming.append(_warm_up(lexer_class))
    return warming


def _warm_up(lexer_class: Any) -> Future[None]:
    """Make a first `lexer_class` in a thread (Python code: the loop gets the GIL between its slices)."""
    with _warming_lock:
        future = _warming.get(lexer_class)
        if future is None:
            future = _warming[lexer_class] = _warmer.submit(_make_first, lexer_class)
        return future


def _make_first(lexer_class: Any) -> None:
    try:
        _lexer(lexer_class)
    except Exception:  # a lexer that cannot be made: a render finds out for itself
        logger.debug("warming up %s failed", lexer_class, exc_info=True)
    finally:
        with _warming_lock:
            _warming.pop(lexer_class, None)


_EXTENSIONS = ["table", "strikethrough"]
_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False,
                                "highlight": _highlight}).enable(_EXTENSIONS)
# The same parse without the inline content (a fifth of a render's time): where a text's top-level
# blocks start and end, for `render_streamed`.
_block_md = MarkdownIt("commonmark", {"html": False}).enable(_EXTENSIONS).disable(["inline", "text_join"])
# Each rule chain is compiled at its first use, and a render in another thread (a worker thread, the
# templates' warm-up) could meanwhile see a chain half built: they are all built here, once.
_md.render("*x*\n")
_block_md.parse("*x*\n")

# Built once: nh3.clean builds its allow-lists anew at every call, a fifth of its time on a streamed reply's
# small blocks. (A Cleaner is used from every render thread at once: it holds no state between calls.)
_CLEANER = nh3.Cleaner(
    tags={"p", "br", "hr", "em", "strong", "del", "code", "pre", "blockquote", "ul", "ol", "li", "a", "span",
          "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"},
    attributes={"a": {"href", "title"}, "ol": {"start"}, "pre": {"class"}, "span": {"class"},
                "th": {"style"}, "td": {"style"}, "code": {"class"}},
    url_schemes={"http", "https", "mailto"}, link_rel="noopener noreferrer nofollow",
    filter_style_properties={"text-align"})


def render_block(text: str) -> Markup:
    """Markdown as HTML that carries no script, event handler or javascript: URL, whatever `text` holds
    (not cached: each block of a streaming message is rendered once, web/streaming.py)."""
    # Images are dropped: an agent could otherwise make every browser fetch a URL of its choosing.
    # html=False already escapes raw HTML in the source; nh3 is the second wall (links, images, attributes).
    html = _md.render(text)
    return Markup(_CLEANER.clean(html))


def render_blocks(texts: tuple[str, ...]) -> list[Markup]:
    """`render_block` of each (one trip to a worker process for a long chunk's blocks, server/offload.py)."""
    return [render_block(text) for text in texts]


@dataclass(frozen=True)
class Rendering:
    """A text's HTML. Made from a stream's blocks (`render_streamed`) that it begins with, every one as it
    was streamed: where the HTML after them starts (`after_blocks`)."""
    html: Markup
    blocks_end: int | None = None

    @property
    def after_blocks(self) -> Markup | None:
        return None if self.blocks_end is None else Markup(self.html[self.blocks_end:])


# The last RENDERED renderings, by text, or for `render_streamed` by text and the blocks it was made from
# (another message of the same text streamed other blocks: what follows them is not the same).
_rendered: OrderedDict[str | tuple[str, bytes], Rendering] = OrderedDict()
_rendered_lock = threading.Lock()  # (renders run in several threads)
RENDERED = 2048


def _once(key: str | tuple[str, bytes], make: Callable[[], Rendering]) -> Rendering:
    with _rendered_lock:
        made = _rendered.get(key)
        if made is not None:
            _rendered.move_to_end(key)
            return made
    made = make()
    with _rendered_lock:
        _rendered[key] = made
        if len(_rendered) > RENDERED:
            _rendered.popitem(last=False)
    return made


def render_markdown(text: str) -> Markup:
    """`render_block`, once per text: a message is rendered for every role that sees it."""
    return _once(text, lambda: Rendering(render_block(text))).html


Rendered = Sequence[tuple[str, str]]  # blocks' Markdown and HTML, in order from a message's first
_BLANK_LINES = re.compile(r"(?:[ \t]*\n)*")
_BLANK = " \t\n"  # what markdown-it counts as blank (not every character `str.strip` takes, as U+00A0)


def render_streamed(text: str, blocks: Rendered) -> Rendering:
    """`render_markdown(text)` for a message whose stream rendered `blocks` (web/streaming.py), rendering
    only what they do not hold already (and nothing when this process made it from the same blocks); and
    when it begins with all of them, what follows them (a page that shows them keeps them).

    A block is taken as it is where no top-level block of the whole text's parse runs across its first
    line or past its end: rendered alone it makes the same blocks, so the same HTML. Where one does
    (a list with a blank line between its items is one list, not two), the text from there is rendered
    with its neighbours, as is what follows the last block. A link reference definition reaches every
    block, so a text holding one is rendered whole, as is one with a `\r` (markdown-it counts it as a
    line end, and lines are counted here by `\n`) or one that differs from what was streamed."""
    if not blocks:
        return Rendering(render_markdown(text))
    digest = hashlib.blake2b(digest_size=16)
    for source, _ in blocks:
        digest.update(len(source).to_bytes(8, "little") + source.encode("utf-8", "surrogatepass"))
    return _once((text, digest.digest()), lambda: _from_blocks(text, blocks))


def _from_blocks(text: str, blocks: Rendered) -> Rendering:
    if "\r" in text:
        return Rendering(render_block(text))
    env: dict[str, Any] = {}
    tokens = _block_md.parse(text, env)
    if env.get("references"):
        return Rendering(render_block(text))
    inside = bytearray(text.count("\n") + 2)  # 1: a line within a top-level block, not its first
    for token in tokens:
        if token.level == 0 and token.nesting >= 0 and token.map:
            first, end = token.map
            inside[first + 1:end] = b"\x01" * max(0, end - first - 1)
    pieces: list[str] = []
    taken = at = line = 0  # the text before `taken` is in `pieces`; the streamed blocks end at `at`, `line`
    kept = 0  # the first blocks, taken as they are and nothing before them
    for source, html in blocks:
        # (a stream keeps no block of blank lines: one was at the start); the pattern matches "" too
        start = _BLANK_LINES.match(text, at).end()  # type: ignore[union-attr]
        if not source.endswith("\n") or not text.startswith(source, start):
            break
        line += text.count("\n", at, start)
        end_line = line + source.count("\n")
        if not inside[line] and not inside[end_line]:
            if text[taken:start].strip(_BLANK):
                pieces.append(render_block(text[taken:start]))
            if len(pieces) == kept:  # nothing rendered before it
                kept += 1
            pieces.append(html)
            taken = start + len(source)
        at, line = start + len(source), end_line
    if text[taken:].strip(_BLANK):
        pieces.append(render_block(text[taken:]))
    return Rendering(Markup("".join(pieces)), sum(map(len, pieces[:kept])) if kept == len(blocks) else None)


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)


def render_open_block(text: str) -> Markup:
    """Markdown of a block still streaming: a code fence left open so far is closed for now, so the code
    shows highlighted, not as a bare ``` and text that jumps into a code block when the fence closes."""
    fence = None
    for match in _FENCE.finditer(text):
        marker = match.group(1)
        if fence is None:
            fence = marker
        elif marker[0] == fence[0] and len(marker) >= len(fence):
            fence = None
    _provisional.on = True
    try:
        return render_block(text if fence is None else f"{text}\n{fence}\n")
    finally:
        _provisional.on = False
