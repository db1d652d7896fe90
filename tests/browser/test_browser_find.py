"""Find and take away (issue #31 item 8) in Chromium: search in the page, the export link, and @mention
completion by keyboard."""
from __future__ import annotations

from playwright.sync_api import expect

from server.testing.openai_double import Text
from tests.fixtures.browser import WorldSetup


def test_search_export_and_mention_completion_by_keyboard(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(lambda body: Text("noted"))
    setup.make_world("alice", "albert", "bob")
    setup.say("the kiwi release is on friday")
    page = setup.open_page()
    expect(page.locator(".log").get_by_text("noted").first).to_be_visible(timeout=10_000)

    expect(page.locator("#find-q")).to_be_hidden()  # closed: the conversation comes first
    page.get_by_text("Search and export").click()
    page.fill("#find-q", "KIWI release")
    page.press("#find-q", "Enter")
    expect(page.locator("#find-results li")).to_have_count(1, timeout=10_000)
    expect(page.locator("#find-results .find-hit")).to_have_text("the kiwi release is on friday")

    with page.expect_download() as download:
        page.click("#export-chat")
    assert download.value.suggested_filename.endswith(".md")
    text = open(download.value.path(), encoding="utf-8").read()
    assert text.startswith("# Main") and "the kiwi release is on friday" in text

    box = page.locator("#say textarea")
    expect(box).to_have_attribute("aria-autocomplete", "list")
    box.focus()
    page.keyboard.type("@al")
    options = page.locator("#mention-list [role=option]")
    expect(options).to_have_text(["@alice", "@albert"])
    expect(options.nth(0)).to_have_attribute("aria-selected", "true")
    page.keyboard.press("ArrowDown")
    expect(options.nth(1)).to_have_attribute("aria-selected", "true")
    expect(box).to_have_attribute("aria-activedescendant", "mention-opt-1")
    page.keyboard.press("Enter")  # takes the option; sends nothing
    expect(box).to_have_value("@albert ")
    expect(page.locator("#mention-list")).to_be_hidden()
    page.keyboard.type("and @b")
    expect(options).to_have_text(["@bob"])
    page.keyboard.press("Tab")
    expect(box).to_have_value("@albert and @bob ")
    page.keyboard.type("@")
    expect(options).to_have_count(3)
    page.keyboard.press("Escape")
    expect(page.locator("#mention-list")).to_be_hidden()
    expect(box).to_have_value("@albert and @bob @")
