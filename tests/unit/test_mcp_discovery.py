"""MCP discovery (issue #15): names sanitised without collisions, every page of tools/list, the list
refreshed on notifications/tools/list_changed, and results of every content kind as text."""
from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

from mcp import types as mcp_types

from server.tools.base import ToolContext
from server.tools.mcp.content import result_text
from server.tools.mcp.tools import McpServerConfig, McpTools, tool_names
from tests.fixtures.eventually import eventually_async

TROUBLE = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")
PAGED = str(Path(__file__).parents[1] / "fixtures" / "mcp_paged_server.py")
VALID = r"^[a-zA-Z0-9_-]{1,64}$"


def test_names_are_sanitised_and_a_clash_gets_a_stable_suffix() -> None:
    listed = ["read.file", "read/file", "read_file", "x" * 100, "y" * 100, "ünïcode", ""]
    names = tool_names("fs", listed)
    assert names[:3] == ["fs__read_file", "fs__read_file_2", "fs__read_file_3"]
    assert len(set(names)) == len(names)
    assert all(len(n) <= 64 and n.startswith("fs__") for n in names)
    assert names[3] != names[4] and len(names[3]) == 64
    assert names == tool_names("fs", listed)  # stable: the same listing gives the same names
    assert all(re.fullmatch(VALID, n) for n in names)


def test_every_content_kind_becomes_readable_text() -> None:
    png = base64.b64encode(b"\x89PNG" + b"\0" * 96).decode()
    result = mcp_types.CallToolResult(content=[
        mcp_types.TextContent(type="text", text="intro"),
        mcp_types.ImageContent(type="image", data=png, mime_type="image/png"),
        mcp_types.ResourceLink(type="resource_link", uri="file:///data/report.pdf", name="report"),
        mcp_types.EmbeddedResource(type="resource", resource=mcp_types.TextResourceContents(
            uri="mem://note", text="the note's text")),
    ])
    assert result_text(result) == ("intro\n[image image/png, 100 bytes]\n[resource link file:///data/report.pdf "
                                   "report]\nthe note's text")
    structured = mcp_types.CallToolResult(content=[], structured_content={"temperature": 21.5})
    assert result_text(structured) == '{"temperature": 21.5}'
    both = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text='{"t": 1}')],
                                    structured_content={"t": 1})
    assert result_text(both) == '{"t": 1}'  # said once


async def test_a_changed_tool_list_is_listed_again(tool_context: ToolContext) -> None:
    config = McpServerConfig(name="t", command=sys.executable, args=[TROUBLE], trusted=True)
    async with McpTools([config]) as mcp:
        tools = {t.name: t for t in mcp.tools()}
        assert "t__late.tool" not in tools and tools["t__grow"].run is not None
        assert await tools["t__grow"].run({"name": "late.tool"}, tool_context) == "added late.tool"
        await eventually_async(lambda: {t.name for t in mcp.tools()}, timeout=10, what="t__late_tool listed",
                               accept=lambda names: "t__late_tool" in names)
        late = next(t for t in mcp.tools() if t.name == "t__late_tool")
        assert late.run is not None and await late.run({"text": "hi"}, tool_context) == "late.tool: hi"


async def test_every_page_of_the_tool_list_is_read_and_names_stay_distinct(tool_context: ToolContext) -> None:
    config = McpServerConfig(name="p", command=sys.executable, args=[PAGED], trusted=True)
    async with McpTools([config]) as mcp:
        tools = {t.name: t for t in mcp.tools()}
        assert set(tools) == {"p__one", "p__two", "p__three", "p__read_file", "p__read_file_2"}  # three pages
        second = tools["p__read_file_2"].run
        assert second is not None and await second({"text": "x"}, tool_context) == "read/file: x"
