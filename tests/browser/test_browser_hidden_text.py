"""Arguments shown as they will run (issue #28, item 3), in Chromium against a real `agent-world serve`:
a call whose command hides characters is shown escaped, warned of in the queue and in the chat's step,
and approving it even once needs a second "yes"."""
from __future__ import annotations

from playwright.sync_api import expect

from tests.browser.test_browser_approvals import ask_alice, focused_id, screenshot
from tests.fixtures.browser import WorldSetup

# Reads `echo ok; X= # rm -rf victim` on screen, the rm seemingly commented out (a right-to-left override
# reverses what follows it); what runs is what the escapes spell out.
DISGUISED = "echo ok; X=\u202e # \u202dmitciv fr- mr\u200b"
ESCAPED = "echo ok; X=\\u202e # \\u202dmitciv fr- mr\\u200b"
NAMES = "U+202E RIGHT-TO-LEFT OVERRIDE, U+202D LEFT-TO-RIGHT OVERRIDE, U+200B ZERO WIDTH SPACE"


def test_a_call_with_hidden_characters_is_shown_escaped_warned_of_and_approved_once_only_when_confirmed(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    page, _ = ask_alice(setup, DISGUISED)
    item = page.locator(".approval.current")
    expect(item.locator("pre.arg-value")).to_have_text(ESCAPED)
    expect(item.locator("pre.arg-value mark.hidden-char")).to_have_count(3)
    expect(item.locator(".hidden-warning")).to_contain_text(
        "This call contains hidden or look-alike Unicode characters")
    expect(item.locator(".hidden-warning")).to_contain_text(NAMES)
    assert DISGUISED not in page.inner_text("#approval-modal")  # nowhere raw, in the queue

    # `o` asks first, as the wide scopes do, naming the characters; Esc goes back, deciding nothing.
    confirm = page.locator("#approval-confirm")
    page.keyboard.press("o")
    expect(confirm).to_be_visible()
    expect(page.locator("#confirm-text")).to_have_text(
        "Approve this shell_exec call once, with the hidden or look-alike characters shown escaped in it?")
    expect(page.locator("#confirm-hidden")).to_have_text(
        f"This call contains hidden or look-alike Unicode characters: {NAMES}.")
    assert focused_id(page) == "approval-confirm"
    screenshot(page, "hidden-characters-confirmation")
    page.keyboard.press("Escape")
    expect(confirm).to_be_hidden()
    item.locator("[data-choice=approve_once]").click()  # the button asks too
    expect(confirm).to_be_visible()
    page.wait_for_timeout(300)
    assert len(setup.pending()) == 1
    page.locator("#confirm-yes").click()
    expect(page.locator(".log")).to_contain_text("approved shell_exec once", timeout=5_000)
    assert setup.pending() == []

    # The chat's step shows the call as it ran: escaped, with the same warning.
    step = page.locator(".log details.step").last
    expect(step.locator("pre.args")).to_contain_text(ESCAPED)
    expect(step.locator(".hidden-warning")).to_contain_text(NAMES)
    expect(step.locator(".step-head code")).to_have_text(ESCAPED)
