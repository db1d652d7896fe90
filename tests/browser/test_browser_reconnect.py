"""The page a team lives in all day (#31): it comes back to live by itself after any outage, and nothing
typed in it is lost: not by a network blip, a server restart, a reload, or a chat deleted meanwhile
(Chromium against a real `agent-world serve`)."""
from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, Locator, Page, expect

from server.testing.openai_double import OpenAIDouble
from tests.browser.test_browser_approvals import ask_alice, open_with_badge
from tests.fixtures.browser import WorldSetup
from tests.fixtures.server import start_server


def _live(page: Page) -> None:
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=15_000)


def _hold_while_offline(page: Page, text: str) -> Locator:
    """Take the page's network away and send `text`: it waits in the outbox (returned), not sent."""
    page.context.set_offline(True)
    expect(page.locator("#connection")).to_have_attribute("data-state", "offline", timeout=5_000)
    page.fill("#say textarea", text)
    page.press("#say textarea", "Enter")
    outbox = page.locator("#outbox > li")
    expect(outbox).to_have_count(1)
    return outbox


def test_a_short_network_blip_comes_back_live_by_itself_and_the_held_message_sends(
        world_setup: WorldSetup) -> None:
    """Found by a user: after a 1.5 s blip the page said "reconnecting…" for good: live messages still came,
    but deciding was off and "Send now" disabled until a reload, which lost the held message."""
    setup = world_setup
    page, _ = ask_alice(setup, "echo risky", open_queue=False)
    outbox = _hold_while_offline(page, "typed while offline")
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
        page.reload()  # still signed in, and the draft is kept
        _live(page)
        expect(box).to_have_value("half a thought")
        box.press("Enter")
        expect(page.locator(".log")).to_contain_text("half a thought", timeout=5_000)
        expect(box).to_have_value("")
    finally:
        setup.close()
        server.stop()


def _show_chat(page: Page, setup: WorldSetup, chat: str) -> None:
    page.goto(f"{setup.server.url}/w/{setup.world}?chat={chat}")
    _live(page)


def test_a_draft_survives_a_reload_in_its_own_chat_and_is_cleared_when_sent(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    ops = setup.make_chat("Ops")
    page = setup.open_page("member", "mia")
    box = page.locator("#say textarea")
    _show_chat(page, setup, "main")
    box.fill("a draft for main")
    _show_chat(page, setup, ops)
    expect(box).to_have_value("")  # each chat has its own
    box.fill("a draft for ops\non two lines")
    page.reload()
    _live(page)
    expect(box).to_have_value("a draft for ops\non two lines")
    _show_chat(page, setup, "main")
    expect(box).to_have_value("a draft for main")
    box.press("Enter")
    expect(page.locator(".log")).to_contain_text("a draft for main", timeout=5_000)
    page.reload()
    _live(page)
    expect(box).to_have_value("")  # sent: no longer a draft
    _show_chat(page, setup, ops)
    expect(box).to_have_value("a draft for ops\non two lines")


def test_a_message_to_a_chat_deleted_meanwhile_stays_in_the_box_with_a_note(world_setup: WorldSetup) -> None:
    """Found by a user: the message was eaten, and a toast showed the chat's raw id."""
    setup = world_setup
    setup.make_world("alice")
    ops = setup.make_chat("Ops")
    owner = setup.open_page(on_dialog=lambda d: d.accept())
    mia = setup.open_page("member", "mia")
    _show_chat(mia, setup, ops)
    owner.get_by_label("Rename or delete the chat Ops").click()
    owner.get_by_role("button", name="Delete the chat Ops").click()
    expect(mia.locator(f"#chat-{ops}")).to_have_count(0)  # her page heard of it
    box = mia.locator("#say textarea")
    box.fill("the release is \"ready\" <b>now</b>")
    box.press("Enter")
    note = mia.locator("#say-note")
    expect(note).to_contain_text("This chat was deleted", timeout=5_000)
    expect(box).to_have_value("the release is \"ready\" <b>now</b>")
    expect(mia.locator("#toasts")).not_to_contain_text(ops)
    assert ops not in note.inner_text()
    mia.reload()  # the chat is gone: the page shows another, and the message comes along in its box
    _live(mia)
    expect(mia.locator("#say textarea")).to_have_value("the release is \"ready\" <b>now</b>")


def test_a_message_held_while_offline_survives_a_reload_until_it_is_sent(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    page = setup.open_page("member", "mia")
    outbox = _hold_while_offline(page, "held while offline")
    page.context.set_offline(False)
    _live(page)
    page.reload()
    _live(page)
    expect(outbox).to_have_count(1)
    expect(outbox.first).to_contain_text("held while offline")
    outbox.first.locator("[data-outbox-send]").click()
    expect(page.locator(".log")).to_contain_text("held while offline", timeout=5_000)
    page.reload()
    _live(page)
    expect(outbox).to_have_count(0)
