"""OAuth MCP sign-in and URL-mode elicitation in Chromium (issue #33), against a real `agent-world serve`, a real
authorization server and MCP servers: nothing opens by itself; the person opens the link, which has no
`window.opener`, and the authorization server brings them back to the callback; the page, the answers and the
server's log never carry a token. A URL question shows its link and host, and Done answers the server."""
from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from playwright.sync_api import expect

from server.tools.mcp.oauth_vault import FileVault
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.mcp_oauth import OAuthServers

TROUBLE = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")


def test_the_owner_opens_the_sign_in_link_and_comes_back_signed_in(world_setup: WorldSetup,
                                                                    oauth_servers: OAuthServers) -> None:
    world_setup.make_world("alice", mcp_servers=[{"name": "sec", "url": oauth_servers.mcp_url, "oauth": True}])
    page = world_setup.open_settings()
    controls = page.locator("#mcp-sign-in-sec")
    expect(controls).to_contain_text("Not signed in.")
    controls.get_by_role("button", name="Sign in to sec").click()
    link = controls.locator("a.mcp-sign-in-link")
    expect(link).to_be_visible(timeout=20_000)
    expect(controls.locator(".mcp-sign-in-host")).to_have_text(oauth_servers.host)
    assert link.get_attribute("rel") == "noopener noreferrer" and link.get_attribute("target") == "_blank"
    assert len(page.context.pages) == 1  # nothing opened by itself

    with page.context.expect_page() as opened:
        link.click()  # the person, deliberately
    tab = opened.value
    tab.wait_for_load_state()
    expect(tab.locator("h1")).to_have_text("Signed in to sec", timeout=20_000)
    assert tab.url.startswith(f"{world_setup.server.url}/oauth/callback?")
    assert tab.evaluate("window.opener === null")

    expect(page.locator("#mcp-state-sec [data-state]")).to_have_attribute("data-state", "up", timeout=20_000)
    expect(controls).to_have_attribute("data-signed-in", "yes")
    with ThreadPoolExecutor(1) as thread:  # Playwright's loop runs in this one
        record = thread.submit(asyncio.run, FileVault(world_setup.server.data_dir).load(world_setup.world, "sec"))
    sealed = record.result() or {}
    tokens = [sealed["tokens"]["access_token"], sealed["tokens"]["refresh_token"]]
    expect(controls).to_contain_text("Signed in.")  # live: the link is gone, without a reload
    expect(controls.locator("a.mcp-sign-in-link")).to_have_count(0)
    shown = page.content() + tab.content() + str(world_setup.api("GET", f"/api/worlds/{world_setup.world}/events"))
    for token in tokens:
        assert token not in shown and token not in world_setup.server.log()


def test_a_url_question_shows_its_link_and_done_answers_the_server(world_setup: WorldSetup) -> None:
    url = f"{world_setup.server.url}/healthz?session=payment-1"
    world_setup.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                  "tools": {"consent": {"approval": "never"}}}])
    world_setup.llm.respond_with(reply_by_turn(lambda: tool_calls(("t__consent", {"url": url}))))
    page = world_setup.open_page("member", "max")
    world_setup.say("pay for it")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=20_000)
    page.locator("#queue-indicator").click()
    item = page.locator("#approval-list [data-elicitation]")
    link = item.locator("a.elicit-link")
    expect(link).to_have_attribute("href", url)
    assert link.get_attribute("rel") == "noopener noreferrer"
    expect(item.locator(".elicit-host")).to_have_text(world_setup.server.url.split("//")[1])
    assert len(page.context.pages) == 1  # shown, not opened
    item.locator('button[data-elicit="accept"]').click()
    expect(page.locator("#approval-list [data-elicitation]")).to_have_count(0, timeout=10_000)

    def result() -> str | None:
        events = world_setup.api("GET", f"/api/worlds/{world_setup.world}/events?after=0")
        return next((e["content"] for e in events if e.get("role") == "tool" and e.get("name") == "t__consent"),
                    None)
    assert wait_until(result, 20, what="the tool's result") == "consent: accept"
