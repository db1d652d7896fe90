"""A streamable-HTTP MCP server's message is bounded as a stdio server's line is (issue #30): a JSON response
body, or one SSE event, over 4x the world's `mcp_result_limit` plus 64 KiB is never held whole. Its call
ends with an error naming the bound, the rest of it is not read, and the server answers the next call; a
result under the bound arrives; a call's SSE stream of many small events is not cut by their total.
Real server: tests/fixtures/mcp_trouble_server.py over streamable HTTP on loopback, in both answer modes."""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from mcp import MCPError

from server.tools.mcp.content import result_text
from server.tools.mcp.server import McpConnection, McpServerConfig
from server.tools.mcp.stdio import message_limit
from tests.fixtures.mcp_trouble import call, connection, http_trouble, just_under_the_bound

LIMIT = 512 * 1024  # the world's mcp_result_limit in these tests
CAP = message_limit(LIMIT)  # 4 x 512 KiB + 64 KiB: over the SDK's own 1 MiB SSE event bound
HUGE = 20_000_000  # characters of the result over the bound: a 40 MB message (text and structured content)


@pytest.fixture(scope="module", params=["sse", "json"])
def http_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The trouble server over streamable HTTP, answering each call with an SSE stream or a JSON body."""
    with http_trouble(*(["--json"] if request.param == "json" else [])) as url:
        yield url


@pytest.fixture
async def conn(http_url: str) -> AsyncIterator[McpConnection]:
    async with connection(McpServerConfig(name="web", url=http_url, trusted=True), lambda: LIMIT) as conn:
        yield conn


async def test_an_http_result_far_over_the_bound_is_refused_unread_and_the_server_answers_the_next_call(
        conn: McpConnection) -> None:
    with pytest.raises(MCPError, match=rf"sent a message of more than {CAP} bytes, over the {CAP} read from it "
                                       r"\(4 x the world's mcp_result_limit \+ 64 KiB\); it was not read"):
        await call(conn, "huge", {"size": HUGE})
    assert 0 < conn.http_bound.max_buffered <= CAP  # 40 MB were sent; at most the bound was ever held
    assert conn.http_bound.passed < CAP + 64 * 1024  # and little more than it was read at all
    echoed = await call(conn, "echo", {"text": "still here"})
    assert result_text(echoed, LIMIT) == "still here" and conn.alive


async def test_an_http_result_just_under_the_bound_arrives_whole_and_is_cut_at_the_limit(
        conn: McpConnection) -> None:
    await just_under_the_bound(conn, LIMIT, lambda: conn.http_bound.max_buffered)


@pytest.mark.parametrize("http_url", ["sse"], indirect=True)  # a JSON body holds the answer only
async def test_a_calls_stream_of_many_small_events_is_not_cut_by_their_total(conn: McpConnection) -> None:
    result = await call(conn, "chatter", {"count": 40, "size": 64 * 1024})
    assert result_text(result, LIMIT) == "40 said"
    # The 40 log messages came on the call's own stream before its answer: 2.5 MiB, each event counted alone.
    assert conn.http_bound.passed > 40 * 64 * 1024 > CAP
    assert conn.http_bound.max_buffered < 2 * 64 * 1024
