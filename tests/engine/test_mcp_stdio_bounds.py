"""A stdio MCP server's message is bounded (issue #30): a line over 4x the world's `mcp_result_limit`
plus 64 KiB is never held whole. The reader drops the rest of it as it streams in, the call it answers
ends with an error naming the bound, and the server answers the next call. A result under the bound
arrives intact. Real server: tests/fixtures/mcp_trouble_server.py over stdio (its results repeat
their text as structured content, so a line is about twice the text)."""
from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest
from mcp import MCPError

from server.tools.mcp.content import result_text
from server.tools.mcp.server import McpConnection, McpServerConfig
from server.tools.mcp.stdio import message_limit
from tests.fixtures.mcp_trouble import TROUBLE, call, connection, just_under_the_bound

LIMIT = 16 * 1024  # the world's mcp_result_limit in these tests
CAP = message_limit(LIMIT)  # 4 x 16 KiB + 64 KiB


@pytest.fixture
async def conn() -> AsyncIterator[McpConnection]:
    config = McpServerConfig(name="t", command=sys.executable, args=[TROUBLE], trusted=True)
    async with connection(config, lambda: LIMIT) as conn:
        yield conn


async def test_a_result_far_over_the_bound_is_refused_unread_and_the_server_answers_the_next_call(
        conn: McpConnection) -> None:
    assert CAP == 4 * LIMIT + 64 * 1024
    with pytest.raises(MCPError, match=rf"sent a message of \d+ bytes, over the {CAP} read from it"):
        await call(conn, "huge", {"size": 20_000_000})
    assert 0 < conn.reader.max_buffered <= CAP  # 40 MB came in; at most the bound was ever held
    echoed = await call(conn, "echo", {"text": "still here"})
    assert result_text(echoed, LIMIT) == "still here" and conn.alive


async def test_a_result_just_under_the_bound_arrives_whole_and_is_cut_at_the_limit(conn: McpConnection) -> None:
    await just_under_the_bound(conn, LIMIT, lambda: conn.reader.max_buffered)


async def test_a_result_just_under_the_limit_arrives_intact(conn: McpConnection) -> None:
    result = await call(conn, "huge", {"size": LIMIT - 1})
    assert result_text(result, LIMIT) == "x" * (LIMIT - 1)
