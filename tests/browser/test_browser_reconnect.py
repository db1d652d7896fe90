"""The page a team lives in all day (#31): it comes back to live by itself after any outage, and what is
typed in it meanwhile is kept (Chromium against a real `agent-world serve`)."""
from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, Page, expect

from server.testing.openai_double import OpenAIDouble
from tests.browser.test_browser_approvals import ask_alice, open_with_badge
from tests.fixtures.browser import WorldSetup
from tests.fixtures.server import start_server


def _live(page: Page) -> None:
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=15_000)


def test_a_short_network_blip_comes_back_live_by_itself_and_the_held_message_sends(
        world_setup: WorldSetup) -> None:
    """Found by a user: after a 1.5 s blip the page said "reconnecting…" for good: live messages still came,
    but deciding was off and "Send now" disabled until a reload, which lost the held message."""
    setup = world_setup
    page, _ = ask_alice(setup, "echo risky", open_queue=False)
    page.context.set_offline(True)
    expect(page.locator("#connection")).to_have_attribute("data-state", "offline", timeout=5_000)
    page.fill("#say textarea", "typed while offline")
    page.press("#say textarea", "Enter")
    outbox = page.locator("#outbox > li")
    expect(outbox).to_have_count(1)
    page.wait_for_timeout(1500)  # the blip: not a wait for something to happen
    page.context.set_offline(False)
    _live(page)
    expect(page.locator("#page-conn")).not_to_have_attribute("data-conn", "", timeout=5_000)
    expect(outbox.first).to_contain_text("The page is back. Send it now?")
    outbox.first.locator("[data-outbox-send]").click()
    expect(page.locator(".log")).to_contain_text("typed while offline", timeout=5_000)
    expect(outbox).to_have_count(0)
    open_with_badge(page)  # deciding works again, on the same page
    once = page.locator(".approval [data-choice=approve_once]")
    expect(once).to_be_enabled()
    page.keyboard.press("o")
    expect(page.locator(".log")).to_contain_text("approved shell_exec once", timeout=5_000)
    assert setup.pending() == []
    setup.say("after the blip")  # and what others say shows live
    expect(page.locator(".log")).to_contain_text("after the blip", timeout=5_000)


def test_a_restart_of_serve_leaves_the_open_page_signed_in_live_and_its_draft_intact(
        tmp_path: Path, llm_double: OpenAIDouble, chromium: Browser) -> None:
    """`./dev serve` as a user runs it (no AGENT_WORLD_TOKEN), restarted with the page open: before, the
    restart made a new owner token, which ended the owner's session."""
    server = start_server(tmp_path / "data", llm=llm_double, kept_token=True)
    setup = WorldSetup(server, llm_double, chromium)
    try:
        setup.make_world("alice")
        page = setup.open_page()
        box = page.locator("#say textarea")
        box.fill("half a thought")
        server.restart()
        _live(page)  # by itself
        expect(page.locator("#session-ended")).to_be_hidden()
        expect(box).to_have_value("half a thought")
        setup.say("said after the restart")
        expect(page.locator(".log")).to_contain_text("said after the restart", timeout=5_000)
        box.press("Enter")
        expect(page.locator(".log")).to_contain_text("half a thought", timeout=5_000)
        expect(box).to_have_value("")
    finally:
        setup.close()
        server.stop()
