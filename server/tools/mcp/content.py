"""An MCP tool result as text the LLM can read: text as is, structured content as JSON, images and
audio as a short description, resources as links.

A result is bounded (the world's `mcp_result_limit`): its text and binary content together count
against the limit, in the server's order; what is past it is left out, and a note says so. The text
is built from the blocks up to the limit only (never the whole result joined), so a large result
costs the parsed message and nothing more, and is never stored whole; a stdio server's message is
itself read only up to 4x the limit (stdio.py)."""
from __future__ import annotations

import json
from typing import Any

from ... import offload
from ...redact import hide_known

RESULT_LIMIT = 1024 * 1024  # bytes of a result (text and binary together) kept by default
_STRUCTURED_LIMIT = 100_000  # characters of structuredContent passed on
_SLICE = 1 << 20  # characters encoded at a time to measure non-ASCII text


def _utf8_size(text: str) -> int:
    if text.isascii():  # constant time in CPython: no copy
        return len(text)
    return sum(len(text[i:i + _SLICE].encode("utf-8", "replace")) for i in range(0, len(text), _SLICE))


def _utf8_head(text: str, size: int) -> str:
    """The longest start of `text` of at most `size` bytes in UTF-8 (a character is never cut)."""
    if text.isascii():
        return text[:size]
    return text[:size].encode("utf-8", "replace")[:size].decode("utf-8", "ignore")


def _binary_size(data: str) -> int:
    return len(data) * 3 // 4 - data[-2:].count("=")  # base64's decoded length


def _parts(result: Any) -> Any:
    """(text shown, bytes it stands for, whether it may be cut) for each block, in order."""
    has_text = False
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "?")
        if kind == "text":
            has_text = True
            yield block.text, None, True
        elif kind in ("image", "audio"):
            size = _binary_size(block.data)
            yield f"[{kind} {block.mime_type}, {size} bytes]", size, False
        elif kind == "resource_link":
            title = getattr(block, "title", None) or getattr(block, "name", None) or ""
            yield f"[resource link {block.uri}{' ' + title if title else ''}]", None, False
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            if isinstance(text, str):
                yield text, None, True
            else:
                blob = getattr(res, "blob", None)
                yield (f"[resource {res.uri} {res.mime_type or ''}]".strip(),
                       _binary_size(blob) if isinstance(blob, str) else None, False)
        else:
            yield f"[{kind} content]", None, False
    structured = getattr(result, "structured_content", None)
    # Servers should repeat structured content in a text block; when none did, the JSON is the text.
    if structured is not None and not has_text:
        yield json.dumps(structured, ensure_ascii=False)[:_STRUCTURED_LIMIT], None, True


def result_text(result: Any, limit: int = RESULT_LIMIT) -> str:
    """The result as text of at most `limit` bytes, then `[truncated: N of M bytes shown]` when it was larger.
    Text counts its UTF-8 bytes; an image, audio or blob its decoded bytes and its description (what shows)."""
    kept: list[str] = []
    room, total, shown = limit, 0, 0
    for index, (text, binary, cuttable) in enumerate(_parts(result)):
        sep = 1 if index else 0  # the "\n" before every part but the first (kept parts are a prefix of all)
        size = sep + _utf8_size(text) + (binary or 0)  # a description costs its text and what it stands for
        total += size
        if room <= 0:
            continue
        if size <= room:
            kept.append(text)
            room -= size
            shown += size
        elif cuttable:
            head = _utf8_head(text, room - sep)
            kept.append(head)
            shown += sep + _utf8_size(head)
            room = 0
        else:
            room = 0  # a description whose content does not fit: it and everything after are left out
    body = "\n".join(kept)
    if total > shown:
        body += f"\n[truncated: {shown} of {total} bytes shown]"
    return body


def shown_text(result: Any, limit: int) -> str:
    """`result_text`, with the secrets the server knows hidden: a result may echo one (a bearer token, an
    env or header value), and it is stored and sent to the LLM as it is here."""
    return hide_known(result_text(result, limit))


def is_large(result: Any) -> bool:
    """Whether making a result's text is worth a worker process: its text blocks and resources, and the
    structured content it may fall back to (dumped as JSON), hold over offload.HEAVY characters. An image's
    or audio's data costs nothing here: only its size is read."""
    size = 0
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None) or getattr(getattr(block, "resource", None), "text", None)
        size += len(text) if isinstance(text, str) else 0
    return size > offload.HEAVY or _larger_than(getattr(result, "structured_content", None), offload.HEAVY)


def _larger_than(value: Any, limit: int) -> bool:
    """Whether a JSON value's strings, keys and other items add up to over `limit` (a walk that stops there)."""
    size, todo = 0, [value]
    while todo:
        item = todo.pop()
        size += 1 + (len(item) if isinstance(item, str) else 0)  # every item counts: the walk stops by `limit`
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        if size > limit:
            return True
    return False
