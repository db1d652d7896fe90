"""What changes elsewhere shows on every open page through its socket, never by polling: MCP server
states, token usage, invites, MCP servers and chat titles (Chromium against a real `agent-world serve`)."""
from __future__ import annotations

import functools
import re
import sys
from typing import Any

from playwright.sync_api import Page, expect

from server.testing.openai_double import Text
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup
from tests.fixtures.tools import ECHO_SERVER


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
    pages = [setup.open_settings(), setup.open_settings()]
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


def test_token_usage_follows_each_reply_on_every_page(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.respond_with(lambda body: Text("a short answer"))
    pages = [setup.open_page(), setup.open_page("member", "mia")]
    for page in pages:  # no reply yet: nothing to show
        expect(page.locator("#usage-alice")).to_be_hidden()
        expect(page.locator("#world-usage")).to_be_hidden()
    for replies, said in ((1, "in 1 reply"), (2, "in 2 replies")):
        setup.say(f"@alice answer number {replies}")
        usage = wait_until(functools.partial(_usage_after, setup, replies), what=f"{replies} replies counted")
        for page in pages:
            expect(page.locator("#usage-alice")).to_contain_text(said)
            expect(page.locator("#usage-alice")).to_contain_text(f"{usage['world']['total_tokens']:,} tokens")
            expect(page.locator("#world-usage")).to_have_text(f"{usage['world']['total_tokens']:,} tokens")


def _usage_after(setup: WorldSetup, replies: int) -> dict[str, Any] | None:
    usage: dict[str, Any] = setup.api("GET", f"/api/worlds/{setup.world}")["usage"]
    return usage if usage["world"]["replies"] == replies else None


def test_a_renamed_chat_changes_the_header_of_the_pages_showing_it(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    ops = setup.make_chat("Ops")
    owner, mia = setup.open_page(), setup.open_page("member", "mia")
    elsewhere = setup.open_page("member", "max")
    for page, chat in ((owner, ops), (mia, ops), (elsewhere, "main")):
        page.goto(f"{setup.server.url}/w/{world}?chat={chat}")
        page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    header = f"#header-title-{ops}"
    expect(mia.locator(header)).to_have_text("/ Ops")
    owner.get_by_label("Rename or delete the chat Ops").click()
    owner.get_by_label("New title of the chat Ops").fill("Release")
    owner.get_by_role("button", name="Rename the chat Ops").click()
    expect(mia.locator(header)).to_have_text("/ Release")  # live, without a reload
    expect(owner.locator(header)).to_have_text("/ Release")
    expect(elsewhere.locator(f"#chat-title-{ops}")).to_have_text("Release")  # its sidebar link
    expect(elsewhere.locator(".topbar .chat-title")).not_to_contain_text("Release")


def test_no_open_invites_comes_back_live_when_the_last_invite_is_revoked_in_the_page(world_setup: WorldSetup) -> None:
    """The empty state is part of the live list: before, it was removed with the first invite and came back
    only with a reload."""
    setup = world_setup
    setup.make_world("alice")
    page, other = setup.open_settings(), setup.open_settings()
    page.on("dialog", lambda d: d.accept())
    for each in (page, other):
        expect(each.locator("#no-invites")).to_be_visible()
    page.get_by_label("Name of the invitee (optional)").fill("sam")
    page.get_by_role("button", name="Make link").click()
    for each in (page, other):
        expect(each.locator("#invites li:visible")).to_have_count(1)
        expect(each.locator("#no-invites")).to_be_hidden()
    page.get_by_role("button", name=re.compile("Revoke the member invite for sam")).click()
    for each in (page, other):  # the page that revoked it and another owner's, without a reload
        expect(each.locator("#invites li:visible")).to_have_count(1)
        expect(each.locator("#no-invites")).to_be_visible()


def test_invites_and_mcp_servers_changed_elsewhere_show_on_every_owners_page(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    pages = [setup.open_settings(), setup.open_settings()]
    made = setup.api("POST", f"/api/worlds/{world}/invites", {"role": "member", "name": "zoe"})
    for page in pages:
        expect(page.locator(f"#invite-{made['id']}")).to_contain_text("zoe")
        expect(page.locator("#no-invites")).to_be_hidden()
    setup.api("DELETE", f"/api/worlds/{world}/invites/{made['id']}")
    for page in pages:
        expect(page.locator(f"#invite-{made['id']}")).to_have_count(0)
        expect(page.locator("#no-invites")).to_be_visible()

    setup.api("PATCH", f"/api/worlds/{world}", {"settings": {"mcp_servers": [
        {"name": "extra", "command": "/nonexistent/mcp-server", "env": {"API_TOKEN": "s3cret-value"}}]}})
    for page in pages:
        expect(page.locator("#mcp-extra")).to_be_visible()
        page.get_by_label("Edit MCP server extra").click()
        expect(page.locator("#mcp-extra form").get_by_label("Environment", exact=False)).to_have_value(
            "API_TOKEN=•••")
        assert "s3cret-value" not in page.content()
    setup.api("PATCH", f"/api/worlds/{world}", {"settings": {"mcp_servers": []}})
    for page in pages:
        expect(page.locator("#mcp-extra")).to_have_count(0)
        expect(page.locator("#mcp-servers")).to_contain_text("No MCP servers.")


def test_a_logout_in_another_tab_ends_the_open_page_at_once(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    mia = setup.open_page("member", "mia")
    other_tab = mia.context.new_page()  # same browser, same session
    other_tab.goto(f"{setup.server.url}/w/{setup.world}")
    assert other_tab.evaluate("() => fetch('/logout', {method: 'POST'}).then(r => r.status)") == 200
    expect(mia.locator("#session-ended")).to_be_visible(timeout=10_000)
    expect(mia.locator("#connection")).to_have_attribute("data-state", "ended")
