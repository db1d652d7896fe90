"""One inbox for every world (issue #31 item 7) in Chromium: live, decidable there, counted on the worlds
list and in the tab title, and without serious or critical axe violations."""
from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.browser.test_browser_a11y import check
from tests.fixtures.browser import WorldSetup, sign_in
from tests.fixtures.engine import run_on_request


def open_inbox(setup: WorldSetup) -> Page:
    context = setup.browser.new_context(viewport={"width": 1280, "height": 800})
    setup.contexts.append(context)
    page = context.new_page()
    sign_in(page, setup.login_url("owner"))
    page.goto(f"{setup.server.url}/inbox")
    expect(page.locator("#inbox-connection")).to_have_attribute("data-state", "live", timeout=10_000)
    return page


def test_a_request_in_another_world_appears_live_and_is_decided_there(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    first = setup.make_world("alice")
    setup.say("run echo first")
    page = open_inbox(setup)
    expect(page.locator(".inbox-item")).to_have_count(1, timeout=10_000)
    expect(page).to_have_title("(1) Inbox — Agent World")
    check(page, "inbox with a request")
    second = setup.make_world("bob")  # another world, with no work when the inbox opened
    setup.say("run echo second")
    items = page.locator(".inbox-item")
    expect(items).to_have_count(2, timeout=10_000)
    expect(items.nth(0)).to_have_attribute("data-world", first)  # oldest first
    expect(items.nth(1)).to_have_attribute("data-world", second)
    expect(items.nth(1).locator(".arg-value")).to_have_text("echo second")
    expect(page).to_have_title("(2) Inbox — Agent World")
    items.nth(1).locator("input[name=reason]").fill("not now")
    items.nth(1).locator("button[data-choice=deny]").click()
    expect(page.locator(".inbox-item")).to_have_count(1, timeout=10_000)
    expect(page).to_have_title("(1) Inbox — Agent World")
    assert setup.pending() == []  # the second world's queue, emptied from the inbox
    page.locator(".inbox-item button[data-choice=approve_once]").click()
    expect(page.locator(".inbox-item")).to_have_count(0, timeout=10_000)
    expect(page.locator("#inbox-empty")).to_be_visible()
    check(page, "empty inbox")


def test_worlds_list_counts_requests_and_titles_the_tab_with_the_total(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    world = setup.make_world("alice", "bob")
    setup.say("@alice run echo one")
    page = open_inbox(setup)
    expect(page.locator(".inbox-item")).to_have_count(1, timeout=10_000)
    page.goto(f"{setup.server.url}/")
    expect(page).to_have_title("(1) Worlds — Agent World")
    expect(page.locator(f'[data-pending-world="{world}"]')).to_have_text("1 waiting")
    setup.say("@bob run echo two")  # bob asks too: the count follows live
    expect(page.locator(f'[data-pending-world="{world}"]')).to_have_text("2 waiting", timeout=10_000)
    expect(page).to_have_title(re.compile(r"^\(2\) Worlds"))


def test_the_world_page_links_the_inbox_with_the_pending_total_for_those_who_decide(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    setup.say("run echo elsewhere")  # a request in another world: the owner's inbox counts it too
    world = setup.make_world("bob")
    owner = setup.open_page()
    member = setup.open_page("member", "mia")
    spectator = setup.open_page("spectator", "sam")
    expect(spectator.locator("#inbox-link")).to_have_count(0)  # a spectator decides nothing

    owner_link, member_link = owner.locator("#inbox-link"), member.locator("#inbox-link")
    expect(owner_link).to_have_accessible_name("Inbox: 1 waiting in all your worlds", timeout=10_000)
    expect(owner_link.locator("#inbox-link-total")).to_have_text("1")
    expect(member_link).to_have_accessible_name("Inbox: nothing waiting", timeout=10_000)
    expect(member_link.locator("#inbox-link-total")).to_be_hidden()

    setup.say("run echo here")  # live: both counts follow
    expect(owner_link.locator("#inbox-link-total")).to_have_text("2", timeout=10_000)
    expect(member_link.locator("#inbox-link-total")).to_have_text("1", timeout=10_000)
    expect(member_link).to_have_accessible_name("Inbox: 1 waiting in all your worlds")

    member_link.click()
    member.wait_for_url(re.compile(r"/inbox$"))
    items = member.locator(".inbox-item")
    expect(items).to_have_count(1, timeout=10_000)
    expect(items.first).to_have_attribute("data-world", world)
