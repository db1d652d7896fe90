"""A stdio MCP server's message is bounded (issue #30): a line over 4x the world's `mcp_result_limit`
plus 64 KiB is never held whole. The reader drops the rest of it as it streams in, the call it answers
ends with an error naming the bound, and the server answers the next call. A result under the bound
arrives intact. Real server: tests/fixtures/mcp_trouble_server.py over stdio (its results repeat
their text as structured content, so a line is about twice the text)."""
from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import MCPError
from mcp import types as mcp_types

from server.tools.mcp.content import result_text
from server.tools.mcp.server import McpConnection, McpServerConfig
from server.tools.mcp.stdio import message_limit

TROUBLE = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")
LIMIT = 16 * 1024  # the world's mcp_result_limit in these tests
CAP = message_limit(LIMIT)  # 4 x 16 KiB + 64 KiB


@pytest.fixture
async def conn() -> AsyncIterator[McpConnection]:
    conn = McpConnection(McpServerConfig(name="t", command=sys.executable, args=[TROUBLE], trusted=True),
                         result_limit=lambda: LIMIT)
    conn.task = asyncio.create_task(conn.serve())
    try:
        await conn.ready
        yield conn
    finally:
        await conn.close(timeout=10)


async def _call(conn: McpConnection, tool: str, args: dict[str, object]) -> mcp_types.CallToolResult:
    assert conn.session is not None
    return await conn.session.call_tool(tool, args)


async def test_a_result_far_over_the_bound_is_refused_unread_and_the_server_answers_the_next_call(
        conn: McpConnection) -> None:
    assert CAP == 4 * LIMIT + 64 * 1024
    with pytest.raises(MCPError, match=rf"sent a message of \d+ bytes, over the {CAP} read from it"):
        await _call(conn, "huge", {"size": 20_000_000})
    assert 0 < conn.reader.max_buffered <= CAP  # 40 MB came in; at most the bound was ever held
    echoed = await _call(conn, "echo", {"text": "still here"})
    assert result_text(echoed, LIMIT) == "still here" and conn.alive


async def test_a_result_just_under_the_bound_arrives_whole_and_is_cut_at_the_limit(conn: McpConnection) -> None:
    size = (CAP - 1024) // 2  # the text twice (content and structured content) and the envelope: under CAP
    result = await _call(conn, "huge", {"size": size})
    assert result_text(result, LIMIT) == "x" * LIMIT + f"\n[truncated: {LIMIT} of {size} bytes shown]"
    assert conn.reader.max_buffered > 2 * size  # the whole line was read
    with pytest.raises(MCPError, match="over the"):  # and a little more is not
        await _call(conn, "huge", {"size": size + 1024})


async def test_a_result_just_under_the_limit_arrives_intact(conn: McpConnection) -> None:
    result = await _call(conn, "huge", {"size": LIMIT - 1})
    assert result_text(result, LIMIT) == "x" * (LIMIT - 1)
