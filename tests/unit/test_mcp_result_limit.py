"""An MCP result is bounded (issue #30): text and binary together at most the limit, cut at a character,
with a note the LLM reads; a result within the limit is unchanged."""
from __future__ import annotations

import base64

from mcp import types as mcp_types

from server.tools.mcp.content import result_text


def _text(text: str) -> mcp_types.TextContent:
    return mcp_types.TextContent(type="text", text=text)


def _image(size: int) -> mcp_types.ImageContent:
    return mcp_types.ImageContent(type="image", data=base64.b64encode(b"\0" * size).decode(), mime_type="image/png")


def test_a_result_within_the_limit_is_unchanged() -> None:
    result = mcp_types.CallToolResult(content=[_text("a" * 50), _image(40)])
    assert result_text(result, limit=1000) == "a" * 50 + "\n[image image/png, 40 bytes]"


def test_text_past_the_limit_is_cut_at_a_character_with_a_note() -> None:
    result = mcp_types.CallToolResult(content=[_text("é" * 1000)])  # 2000 bytes
    text = result_text(result, limit=1001)
    body, note = text.rsplit("\n", 1)
    assert body == "é" * 500 and note == "[truncated: 1000 of 2000 bytes shown]"


def test_binary_counts_against_the_limit_and_many_small_blocks_stay_bounded() -> None:
    blocks: list[mcp_types.ContentBlock] = [_image(4), _text("after"), *[_image(1)] * 10_000]
    result = mcp_types.CallToolResult(content=blocks)
    text = result_text(result, limit=100)
    body, note = text.rsplit("\n[truncated: ", 1)
    assert len(body.encode()) <= 100 and body.startswith("[image image/png, 4 bytes]\nafter")
    image = len("[image image/png, 1 bytes]") + 1
    assert note.endswith(f" of {26 + 4 + 1 + 5 + 10_000 * (1 + image)} bytes shown]")
