"""The owner's management in the page (issue #14 items 8-11), in Chromium against a real `agent-world serve`."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from server.testing.openai_double import Status, Text
from tests.browser.test_browser_a11y import check
from tests.browser.test_browser_page import SHOTS
from tests.fixtures.browser import WorldSetup
from tests.fixtures.eventually import eventually


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"manage-{name}.png"))


def test_world_settings_validate_inline_and_save(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    page = setup.open_settings()
    form = page.locator("#settings-form")
    form.get_by_label("World name").fill("Renamed team")
    turn_limit = form.get_by_label("Turn limit", exact=False)
    turn_limit.fill("500")
    assert turn_limit.evaluate("e => e.validity.rangeOverflow")  # the browser checks it first…
    form.evaluate("f => f.noValidate = true")  # …and the server too, as a client without that check meets it
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

    page.goto(f"{setup.server.url}/w/no-such-world")  # an error page, in the site's layout
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.locator("#theme-toggle")).to_be_visible()


def test_mcp_servers_add_show_state_edit_keep_secret_and_remove(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    page = setup.open_settings()
    page.get_by_text("Add an MCP server").click()
    add = page.locator("#mcp form").last
    add.get_by_label("Name", exact=True).fill("broken")
    add.get_by_label("Command", exact=True).fill("/nonexistent/mcp-server")
    add.get_by_label("Environment", exact=False).fill("API_TOKEN=s3cret-value")
    add.get_by_role("button", name="Add MCP server").click()
    row = page.locator("#mcp-broken")
    expect(row).to_be_visible()
    assert "s3cret-value" not in page.content()  # a secret is never rendered back
    setup.say("hello")  # (an agent's turn starts it, if a running world has not already): the line follows
    # its state until it is up or failed, with the reason
    expect(page.locator("#mcp-broken .mcp-state")).to_have_text("failed", timeout=30_000)
    expect(page.locator("#mcp-broken .mcp-reason")).to_contain_text("nonexistent")
    shot(page, "mcp-failed")
    page.get_by_label("Edit MCP server broken").click()
    edit = page.locator("#mcp-broken form")
    expect(edit.get_by_label("Environment", exact=False)).to_have_value("API_TOKEN=•••")
    edit.get_by_label("Command", exact=True).fill("/nonexistent/other")
    edit.get_by_role("button", name="Save broken").click()
    expect(page.locator("#mcp-broken")).to_be_visible()
    # The save is a request of its own: read the settings once it has been applied, not before.
    servers = eventually(lambda: setup.api("GET", f"/api/worlds/{world}")["settings"]["mcp_servers"],
                         accept=lambda s: s[0]["command"] == "/nonexistent/other", what="the saved command")
    # ••• would be refused had it no stored value behind it: the secret was kept, not replaced.
    assert servers[0]["env"] == {"API_TOKEN": "•••"}
    page.once("dialog", lambda d: d.accept())
    page.get_by_label("Remove MCP server broken").click()
    expect(page.locator("#mcp-broken")).to_have_count(0)
    assert setup.api("GET", f"/api/worlds/{world}")["settings"]["mcp_servers"] == []


def test_agents_add_with_inline_errors_list_models_test_and_remove(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    page = setup.open_settings()
    page.get_by_text("Add an agent", exact=True).click()
    form = page.locator("#agent-form")
    name = form.get_by_label("Name", exact=True)
    name.fill("bad name!")
    assert name.evaluate("e => !e.validity.valid && e.validity.patternMismatch")  # the pattern works in the browser
    name.fill("alice")  # valid in the browser, refused by the server: the error beside the field, values kept
    form.get_by_label("Base URL", exact=False).fill(setup.llm.base_url)
    form.get_by_role("button", name="Load the models of the new agent's endpoint").click()
    expect(page.locator("#models-new-status")).to_contain_text("1 model listed")
    expect(page.locator("#models-new option")).to_have_attribute("value", "double-model")
    page.locator("#agent-form").get_by_label("Model", exact=True).fill("double-model")
    page.locator("#agent-form").get_by_role("button", name="Add agent").click()
    expect(page.locator("#agent-new-name-error")).to_contain_text("already exists")
    expect(page.locator("#agent-new-name")).to_have_value("alice")
    expect(page.locator("#agent-new-model")).to_have_value("double-model")
    shot(page, "agent-error")
    page.locator("#agent-new-name").fill("carol")
    page.locator("#agent-form").get_by_role("button", name="Add agent").click()
    expect(page.locator("#agent-form .saved")).to_have_text("Added carol.")
    expect(page.locator("#agent-config-carol")).to_be_visible()  # the live fragment

    setup.llm.queue(Text("OK"))
    page.get_by_role("button", name="Test carol").click()
    expect(page.locator("#agent-test-carol")).to_contain_text("double-model answered: OK")
    setup.llm.queue(Status(401, "Incorrect API key provided"))
    page.get_by_role("button", name="Test carol").click()
    expect(page.locator("#agent-test-carol")).to_contain_text(f"401 from {setup.llm.base_url}: check OPENAI_API_KEY")
    shot(page, "agent-test")

    page.get_by_label("Edit carol").click()
    meta = page.locator("#agent-config-carol")
    meta.get_by_label("Base URL").fill("ftp://example.com/v1")  # a URL to the browser, refused by the server
    meta.get_by_role("button", name="Save carol").click()
    expect(page.locator("#agent-carol-base_url-error")).to_contain_text("base_url must be an http(s) URL")
    expect(page.locator("#agent-carol-base_url")).to_have_value("ftp://example.com/v1")
    page.locator("#agent-carol-base_url").fill(setup.llm.base_url)
    page.locator("#agent-carol-model").fill("other-model")
    page.locator("#agent-config-carol").get_by_role("button", name="Save carol").click()
    expect(page.locator("#agent-config-carol")).to_contain_text("openai · other-model")
    expect(page.locator("#agent-carol-base_url-error")).to_have_count(0)

    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Remove carol").click()
    expect(page.locator("#agent-config-carol")).to_have_count(0)


def test_a_chat_rename_shows_its_error_in_the_form_and_then_renames(world_setup: WorldSetup) -> None:
    """Before, an empty title (or a chat deleted meanwhile) left the world page for the site's error page."""
    setup = world_setup
    setup.make_world("alice")
    ops = setup.make_chat("Ops")
    page = setup.open_page()
    page.get_by_label("Rename or delete the chat Ops").click()
    form = page.locator(f"#chat-{ops} form")
    form.get_by_label("New title of the chat Ops").fill("")
    form.evaluate("f => f.noValidate = true")  # the server's check, as a client without the browser's meets it
    form.get_by_role("button", name="Rename the chat Ops").click()
    expect(page.locator(f"#rename-{ops}-title-error")).to_have_text("a chat title is 1 to 200 characters")
    expect(page.locator(f"#rename-{ops}-title")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")  # still the world page
    page.locator(f"#rename-{ops}-title").fill("Release")
    page.get_by_role("button", name="Rename the chat Ops").click()
    expect(page.locator(f"#chat-title-{ops}")).to_have_text("Release")
    expect(page.get_by_label("Rename or delete the chat Release")).to_be_visible()
    expect(page.locator(f"#rename-{ops}-title-error")).to_have_count(0)


def test_chats_rename_delete_invites_revoke_and_logout(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    ops = setup.make_chat("Ops")
    mia = setup.open_page("member", "mia")
    page = setup.open_page()
    page.get_by_label("Rename or delete the chat Ops").click()
    page.get_by_label("New title of the chat Ops").fill("Release")
    page.get_by_role("button", name="Rename the chat Ops").click()
    expect(page.locator(f"#chat-title-{ops}")).to_have_text("Release")
    expect(mia.locator(f"#chat-title-{ops}")).to_have_text("Release")  # live, on a member's page
    assert mia.get_by_label("Rename or delete the chat Release").count() == 0  # no owner controls for members
    page.get_by_label("Rename or delete the chat Release").click()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete the chat Release").click()
    expect(mia.locator(f"#chat-{ops}")).to_have_count(0)

    page.goto(f"{setup.server.url}/w/{setup.world}/settings")  # invites are the settings view's
    expect(page.locator("#invites li:visible")).to_have_count(1)  # mia's invite
    page.locator("form[hx-post$='/invites'] select").select_option("spectator")
    page.get_by_label("Name of the invitee (optional)").fill("sam")
    page.get_by_role("button", name="Make link").click()
    expect(page.locator("#invite-url")).to_have_value(re.compile("/login\\?.*token="))
    expect(page.locator("#invites li:visible")).to_have_count(2)
    page.get_by_role("button", name="Copy link").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name=re.compile("Revoke the member invite for mia")).click()
    expect(page.locator("#invites li:visible")).to_have_count(1)
    mia.reload()
    expect(mia.locator("body")).to_contain_text("not signed in")  # her session ended with her invite
    shot(page, "invites")

    page.get_by_role("button", name="Log out").click()
    page.goto(f"{setup.server.url}/w/{setup.world}")
    expect(page.locator("body")).to_contain_text("not signed in")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_open_management_forms_have_no_serious_axe_violation(world_setup: WorldSetup, theme: str) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.make_chat("Ops")
    setup.api("PATCH", f"/api/worlds/{setup.world}", {"settings": {"mcp_servers": [
        {"name": "files", "command": "/nonexistent/server", "env": {"TOKEN": "s3cret"}}]}})
    page = setup.open_settings(color_scheme=theme)
    page.locator("#settings-form #settings-turn_limit").evaluate("e => e.closest('form').noValidate = true")
    for details in page.locator(".settings-view details").all():
        details.evaluate("d => d.open = true")
    page.locator("#settings-turn_limit").fill("0")
    page.locator("#settings-form").get_by_role("button", name="Save settings").click()
    expect(page.locator("#settings-turn_limit-error")).to_be_visible()  # an error beside its field, checked too
    page.locator(".settings-view details").first.evaluate("d => d.open = true")
    assert "s3cret" not in page.content()
    shot(page, f"forms-{theme}")
    check(page, f"management forms ({theme})")


def test_the_owner_signs_in_by_pasting_the_token_on_the_sign_in_page(world_setup: WorldSetup) -> None:
    """With AGENT_WORLD_TOKEN set (always under compose), `serve` prints no login link: the sign-in page
    only told the owner to open one (an operator's run found no way in but building the URL by hand)."""
    setup = world_setup
    world = setup.make_world("alice")
    context = setup.browser.new_context()
    setup.contexts.append(context)
    page = context.new_page()
    page.goto(f"{setup.server.url}/w/{world}")
    check(page, "the sign-in page")
    page.get_by_label("Token").fill(setup.server.token)
    page.locator("#token-login").get_by_role("button", name="Sign in").click()
    page.goto(f"{setup.server.url}/w/{world}")
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
