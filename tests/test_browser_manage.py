"""The owner's management in the page (issue #14 items 8-11), in Chromium against a real `agent-world serve`."""
from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from server.testing.openai_double import Status, Text
from tests.fixtures.browser import WorldSetup
from tests.test_browser_page import SHOTS


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"manage-{name}.png"))


def test_world_settings_validate_inline_and_save(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    page = setup.open_page()
    page.get_by_text("Name, turn limit, approval timeout, context window").click()
    form = page.locator("#settings-form")
    form.get_by_label("World name").fill("Renamed team")
    form.get_by_label("Turn limit", exact=False).fill("500")  # the browser allows it (no max check by JS): see below
    form.evaluate("f => f.noValidate = true")  # the server's own check, as a script-less client would meet it
    form.get_by_role("button", name="Save settings").click()
    error = page.locator("#settings-turn_limit-error")
    expect(error).to_contain_text("turn_limit must be an integer from 1 to 100")
    expect(page.locator("#settings-turn_limit")).to_have_value("500")  # kept
    expect(page.locator("#settings-name")).to_have_value("Renamed team")
    shot(page, "settings-error")
    page.locator("#settings-form").get_by_label("Turn limit", exact=False).fill("7")
    page.locator("#settings-form").evaluate("f => f.noValidate = true")
    page.locator("#settings-form").get_by_role("button", name="Save settings").click()
    expect(page.locator("#settings-form .saved")).to_have_text("Saved.")
    expect(page.locator("#world-name")).to_have_text("Renamed team")  # the live fragment
    settings = setup.api("GET", f"/api/worlds/{world}")["settings"]
    assert settings["turn_limit"] == 7


def test_mcp_servers_add_show_state_edit_keep_secret_and_remove(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    page = setup.open_page()
    page.get_by_text("Add an MCP server").click()
    add = page.locator("#mcp form").last
    add.get_by_label("Name", exact=True).fill("broken")
    add.get_by_label("Command", exact=True).fill("/nonexistent/mcp-server")
    add.get_by_label("Environment", exact=False).fill("API_TOKEN=s3cret-value")
    add.get_by_role("button", name="Add MCP server").click()
    row = page.locator("#mcp-broken")
    expect(row).to_be_visible()
    assert "s3cret-value" not in page.content()  # a secret is never rendered back
    # The engine starts it on first use; the page shows its state when reloaded.
    setup.say("hello")
    expect(page.locator("#log-main")).to_contain_text("hello")
    page.reload()
    expect(page.locator("#mcp-broken .mcp-state")).to_have_attribute("data-state", re.compile("starting|up|failed|stopped"))
    page.get_by_label("Edit MCP server broken").click()
    edit = page.locator("#mcp-broken form")
    expect(edit.get_by_label("Environment", exact=False)).to_have_value("API_TOKEN=•••")
    edit.get_by_label("Command", exact=True).fill("/nonexistent/other")
    edit.get_by_role("button", name="Save broken").click()
    expect(page.locator("#mcp-broken")).to_be_visible()
    # ••• would be refused had it no stored value behind it: the secret was kept, not replaced.
    servers = setup.api("GET", f"/api/worlds/{world}")["settings"]["mcp_servers"]
    assert servers[0]["command"] == "/nonexistent/other" and servers[0]["env"] == {"API_TOKEN": "•••"}
    page.once("dialog", lambda d: d.accept())
    page.get_by_label("Remove MCP server broken").click()
    expect(page.locator("#mcp-broken")).to_have_count(0)
    assert setup.api("GET", f"/api/worlds/{world}")["settings"]["mcp_servers"] == []
