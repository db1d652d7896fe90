"""The world's settings view (#31 item 10), in Chromium against a real `agent-world serve`: the owner's
administration on a page of its own, live over the page socket; the world page's sidebar keeps the day."""
from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.test_browser_a11y import PHONE, check
from tests.fixtures.browser import WorldSetup

ADMIN = ("#agent-form", "#agent-config", "#settings-form", "#mcp", "#rules", "#grants", "#invites", "#rule-form")


def _settings_link(page: Page) -> Any:
    return page.locator("#sidebar").get_by_role("link", name="Settings", exact=True)


def test_the_owner_reaches_the_settings_view_and_adds_an_agent_a_rule_and_an_invite_live(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    world_page = setup.open_page()  # another owner's tab on the world page: the new agent reaches its sidebar
    other = setup.open_settings()  # and another's settings view: everything added here reaches it live
    page = setup.open_page()
    _settings_link(page).click()
    expect(page).to_have_url(f"{setup.server.url}/w/{world}/settings")
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")
    expect(page).to_have_title(re.compile("^Settings — "))

    page.get_by_text("Add an agent", exact=True).click()
    form = page.locator("#agent-form")
    form.get_by_label("Name", exact=True).fill("carol")
    form.get_by_label("Model", exact=True).fill("double-model")
    form.get_by_label("Base URL", exact=False).fill(setup.llm.base_url)
    form.get_by_role("button", name="Add agent").click()
    expect(page.locator("#agent-form .saved")).to_have_text("Added carol.")
    for each in (page, other):  # the live fragment, in the same id on every settings view
        expect(each.locator("#agent-config-carol")).to_contain_text("openai · double-model")
        expect(each.get_by_label("Edit carol")).to_be_visible()
    expect(world_page.locator("#agent-carol #status-carol")).to_have_text("idle")  # the sidebar: its state
    expect(world_page.get_by_label("Edit carol")).to_have_count(0)  # and no administration

    page.get_by_text("Add a rule", exact=True).click()
    rule = page.locator("#rule-form")
    rule.get_by_label("Tool", exact=True).fill("shell_exec")
    rule.get_by_label("Argument", exact=False).fill("command")
    rule.get_by_label("Its pattern", exact=False).fill("git status*")
    rule.get_by_label("Effect").select_option("allow")
    rule.get_by_role("button", name="Add rule").click()
    expect(page.locator("#rule-form .saved")).to_have_text("Added.")
    for each in (page, other):
        expect(each.locator("#rules li")).to_have_count(1)
        expect(each.locator("#rules li")).to_contain_text("shell_exec")
        expect(each.locator("#rules li")).to_contain_text("git status*")
    assert [r["match"] for r in setup.api("GET", f"/api/worlds/{world}/rules")] == [{"command": "git status*"}]

    page.get_by_label("Name of the invitee (optional)").fill("sam")
    page.get_by_role("button", name="Make link").click()
    expect(page.locator("#invite-url")).to_have_value(re.compile("/login\\?.*token="))
    for each in (page, other):
        expect(each.locator("#invites li:visible")).to_have_count(1)
        expect(each.locator("#invites")).to_contain_text("sam")

    page.get_by_role("link", name="Back to the world").click()
    expect(page.locator("#agent-carol")).to_be_visible()
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")


@pytest.mark.parametrize("role", ["member", "spectator"])
def test_a_member_and_a_spectator_see_no_settings_link_and_are_refused_the_view(
        world_setup: WorldSetup, role: str) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    page = setup.open_page(role, f"{role}-1")
    expect(page.locator("#agents #status-alice")).to_be_visible()
    expect(page.get_by_role("link", name="Settings")).to_have_count(0)
    answer = page.goto(f"{setup.server.url}/w/{world}/settings")
    assert answer is not None and answer.status == 403
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    for part in ADMIN:
        expect(page.locator(part)).to_have_count(0)


def test_the_world_pages_sidebar_shows_chats_agents_state_presence_and_files_and_no_administration(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice", "bob")
    setup.make_chat("Ops")
    page = setup.open_page()
    sidebar = page.locator("#sidebar")
    for name in ("alice", "bob"):
        expect(sidebar.locator(f"#agent-{name} #status-{name}")).to_have_text("idle")
        expect(sidebar.locator(f"#agent-{name} [data-stop='{name}']")).to_have_count(1)  # Stop, while busy
    expect(sidebar.locator("#chats li")).to_have_count(2)
    expect(sidebar.locator("#members")).to_contain_text("owner")
    expect(sidebar.locator("#files-panel")).to_be_visible()
    for part in ADMIN:
        expect(page.locator(part)).to_have_count(0)
    for label in ("Edit alice", "Test alice", "Remove alice"):
        expect(page.get_by_label(label)).to_have_count(0)
    expect(_settings_link(page)).to_be_visible()


def test_on_a_phone_the_settings_link_is_in_the_drawer_and_the_view_fits(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice")
    page = setup.open_page(viewport=PHONE, is_mobile=True, has_touch=True)
    expect(page.locator("#sidebar")).to_be_hidden()
    page.get_by_role("button", name="Menu").tap()
    link = _settings_link(page)
    expect(link).to_be_visible()
    link.tap()
    expect(page).to_have_url(f"{setup.server.url}/w/{world}/settings")
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")
    expect(page.get_by_role("heading", name="Agents")).to_be_in_viewport()
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")  # nothing sideways
    page.get_by_text("Add an agent", exact=True).tap()
    expect(page.locator("#agent-form").get_by_role("button", name="Add agent")).to_be_visible()


def populated(setup: WorldSetup, **options: Any) -> Page:
    """The settings view with something in every section (an API-key warning aside), its forms open."""
    setup.make_world("alice", "bob")
    world = setup.world
    setup.api("POST", f"/api/worlds/{world}/rules", {"tool": "shell_exec", "match": {"command": "ls *"},
                                                     "effect": "allow"})
    setup.api("POST", f"/api/worlds/{world}/invites", {"role": "member", "name": "zoe"})
    setup.api("PATCH", f"/api/worlds/{world}", {"settings": {"mcp_servers": [
        {"name": "files", "command": "/nonexistent/server", "env": {"TOKEN": "s3cret"}}]}})
    page = setup.open_settings(**options)
    for details in page.locator(".settings-view details").all():
        details.evaluate("d => d.open = true")
    assert "s3cret" not in page.content()
    return page


@pytest.mark.parametrize(("theme", "viewport"), [("light", None), ("dark", None), ("light", PHONE), ("dark", PHONE)],
                         ids=["light", "dark", "light-390x844", "dark-390x844"])
def test_the_settings_view_has_no_serious_or_critical_axe_violation(
        world_setup: WorldSetup, theme: str, viewport: dict[str, int] | None) -> None:
    size: dict[str, Any] = {"viewport": viewport} if viewport else {}
    page = populated(world_setup, color_scheme=theme, **size)
    check(page, f"settings view ({theme}, {viewport or 'desktop'})")

