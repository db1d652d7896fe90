"""Issue #32 in Chromium against a real `agent-world serve`: a grant for a time (its time left shown, and
revoked), batch decisions that show and decide exactly what they list, and who may still decide."""
from __future__ import annotations

from playwright.sync_api import expect

from tests.browser.test_browser_approvals import ask_alice
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup


def test_approve_for_30_minutes_shows_the_time_left_and_can_be_revoked(world_setup: WorldSetup) -> None:
    setup = world_setup
    page, ops = ask_alice(setup, "echo one", "Ops")
    current = page.locator(".approval.current")
    expect(current.locator('button[data-choice="approve_for"]')).to_contain_text("Approve for 30 minutes")
    page.keyboard.press("f")
    expect(page.locator("#confirm-text")).to_have_text(
        "Allow every shell_exec call in chat Ops, for alice, for the next 30 minutes?")
    page.locator("#confirm-yes").click()
    expect(page.locator("#queue-count")).to_have_text("0", timeout=5_000)
    [grant] = wait_until(lambda: setup.api("GET", f"/api/worlds/{setup.world}/grants"), what="the grant")
    assert (grant["tool"], grant["chat"], grant["agent"]) == ("shell_exec", ops, "alice")
    assert grant["expires_at"]
    settings = setup.open_settings()
    row = settings.locator(f"#grant-{grant['id']}")
    expect(row.locator("time.grant-left")).to_have_text("30 min left")
    row.get_by_role("button", name="Revoke").click()
    expect(row).to_have_count(0, timeout=5_000)
    assert setup.api("GET", f"/api/worlds/{setup.world}/grants") == []
