"""Markdown to safe HTML: markdown-it-py renders (raw HTML off), nh3 sanitizes what comes out."""
from __future__ import annotations

from functools import lru_cache

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup

_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable(
    ["table", "strikethrough"])

_TAGS = {"p", "br", "hr", "em", "strong", "del", "code", "pre", "blockquote", "ul", "ol", "li", "a",
         "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"}
_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"},
               "th": {"style"}, "td": {"style"}, "code": {"class"}}


@lru_cache(maxsize=2048)
def render_markdown(text: str) -> Markup:
    """Markdown as HTML that carries no script, event handler or javascript: URL, whatever `text` holds."""
    # Images are dropped: an agent could otherwise make every browser fetch a URL of its choosing.
    # html=False already escapes raw HTML in the source; nh3 is the second wall (links, images, attributes).
    html = _md.render(text)
    clean = nh3.clean(html, tags=_TAGS, attributes=_ATTRIBUTES, url_schemes={"http", "https", "mailto"},
                      link_rel="noopener noreferrer nofollow", filter_style_properties={"text-align"})
    return Markup(clean)
