"""What changes elsewhere shows on every open page through its socket, never by polling: MCP server
states, token usage, invites, MCP servers and chat titles (Chromium against a real `agent-world serve`)."""
from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.fixtures.browser import WorldSetup

ECHO_SERVER = str(Path(__file__).parent / "fixtures" / "mcp_echo_server.py")


def _requests(page: Page) -> list[str]:
    """Every URL `page` asks from now on."""
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    return urls


def test_an_mcp_servers_state_changes_live_on_every_owners_page(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    setup.api("PATCH", f"/api/worlds/{world}", {"settings": {"mcp_servers": [
        {"name": "tools", "command": "/nonexistent/mcp-server", "trusted": True}]}})
    pages = [setup.open_page(), setup.open_page()]
    asked = [_requests(page) for page in pages]
    setup.say("hello")  # an agent's turn starts the world's MCP servers
    for page in pages:
        expect(page.locator("#mcp-tools .mcp-state")).to_have_text("failed", timeout=30_000)
        expect(page.locator("#mcp-tools .mcp-reason")).to_contain_text("nonexistent")
    # Fixed through the API: the running server restarts with it, and both pages follow.
    setup.api("PATCH", f"/api/worlds/{world}", {"settings": {"mcp_servers": [
        {"name": "tools", "command": sys.executable, "args": [ECHO_SERVER], "trusted": True}]}})
    for page in pages:
        expect(page.locator("#mcp-tools .mcp-state")).to_have_text("up", timeout=30_000)
        expect(page.locator("#mcp-tools .mcp-reason")).to_have_count(0)
    for urls in asked:
        assert not [u for u in urls if "/mcp/" in u], f"the page asked the server: {urls}"
