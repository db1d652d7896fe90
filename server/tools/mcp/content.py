"""An MCP tool result as text the LLM can read: text as is, structured content as JSON, images and
audio as a short description, resources as links."""
from __future__ import annotations

import json
from typing import Any

_STRUCTURED_LIMIT = 100_000  # characters of structuredContent passed on


def result_text(result: Any) -> str:
    parts: list[str] = []
    has_text = False
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)
            has_text = True
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4 - block.data[-2:].count("=")  # base64's decoded length
            parts.append(f"[{kind} {block.mime_type}, {size} bytes]")
        elif kind == "resource_link":
            title = getattr(block, "title", None) or getattr(block, "name", None) or ""
            parts.append(f"[resource link {block.uri}{' ' + title if title else ''}]")
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {res.uri} {res.mime_type or ''}]".strip())
        else:
            parts.append(f"[{kind} content]")
    structured = getattr(result, "structured_content", None)
    # Servers should repeat structured content in a text block; when none did, the JSON is the text.
    if structured is not None and not has_text:
        parts.append(json.dumps(structured, ensure_ascii=False)[:_STRUCTURED_LIMIT])
    return "\n".join(parts)
