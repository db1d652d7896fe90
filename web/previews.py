"""A file's preview, made in a worker process (web/files.py): Markdown and Pygments hold the GIL. A module
of its own, so that a worker imports only what it needs."""
from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape
from pygments import highlight  # type: ignore[import-untyped]
from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]
from pygments.lexers import get_lexer_for_filename  # type: ignore[import-untyped]
from pygments.util import ClassNotFound  # type: ignore[import-untyped]

from .markdown import render_block

MARKDOWN = (".md", ".markdown")
_FORMATTER = HtmlFormatter(nowrap=True)  # the same token classes as the conversation's code blocks


def shown(name: str, data: bytes, size: int) -> dict[str, Any]:
    """How a file's first bytes preview: Markdown, highlighted code or text, or "binary"."""
    view: dict[str, Any] = {"kind": "binary", "html": Markup(""), "cut": size > len(data)}
    if b"\x00" in data[:8192]:
        return view
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not view["cut"] or exc.start < len(data) - 4:  # a character cut at the end of a partial read is fine
            return view
        text = data[:exc.start].decode("utf-8")
    if name.lower().endswith(MARKDOWN):
        return {**view, "kind": "markdown", "html": render_block(text)}
    try:
        lexer = get_lexer_for_filename(name, stripnl=False)
    except ClassNotFound:
        return {**view, "kind": "text", "html": escape(text)}
    return {**view, "kind": "code", "html": Markup(highlight(text, lexer, _FORMATTER))}
