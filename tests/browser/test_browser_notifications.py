"""Issue #32 in Chromium against a real `agent-world serve`: the owner manages webhooks and escalation in the
settings view and sees the deliveries' outcomes; an escalated request says so in its chat and stays in the
queue; a grant for a short time shows its time left and leaves the page by itself when it ends."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from playwright.sync_api import expect

from tests.browser.test_browser_a11y import check
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import run_on_request

HOOK = "http://127.0.0.1:9/hook/T0/B0/secretpath"  # loopback, its path a secret: refused unless allowed


def test_the_owner_adds_a_webhook_and_escalation_and_sees_the_deliveries_outcomes(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    world = setup.make_world("alice")
    page = setup.open_settings()
    section = page.locator("#notifications")
    section.get_by_text("Add a webhook", exact=True).click()
    form = page.locator("#webhook-form")
    form.get_by_label("URL", exact=True).fill(HOOK)
    form.get_by_label("Format").select_option("slack")
    for subject in ("decision", "timeout", "escalation"):
        form.get_by_label(subject, exact=True).uncheck()
    form.get_by_role("button", name="Add webhook").click()
    expect(section.locator("#webhooks li")).to_have_count(1)
    expect(section.locator("#webhook-0")).to_contain_text("127.0.0.1 · Slack · request")
    section.get_by_label("Edit webhook to 127.0.0.1").click()
    expect(section.locator("#webhook-0-url")).to_have_value("•••")  # write-only, as MCP secrets
    assert "secretpath" not in page.content()
    [hook] = setup.api("GET", f"/api/worlds/{world}")["settings"]["webhooks"]
    assert (hook["url"], hook["format"], hook["events"], hook["allow_private"]) == ("•••", "slack", ["request"], False)

    escalation = page.locator("#escalation-form")
    escalation.get_by_label("Escalate a request unanswered for", exact=False).fill("30")
    escalation.get_by_label("Escalate to", exact=False).fill("owner")
    escalation.get_by_role("button", name="Save escalation").click()
    expect(page.locator("#escalation-form .saved")).to_have_text("Saved.")
    settings = setup.api("GET", f"/api/worlds/{world}")["settings"]
    assert (settings["escalate_after"], settings["escalate_to"]) == (30, ["owner"])
    check(page, "the settings view's notifications")

    setup.say("run echo hi")  # a request: the webhook is tried, and refused its loopback target
    wait_until(lambda: [e for e in setup.api("GET", f"/api/worlds/{world}/events?after=0")
                        if e.get("kind") == "webhook_failed"], what="the delivery's outcome")
    page.get_by_role("button", name="Refresh").click()
    row = page.locator("#webhook-deliveries tr.delivery")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("127.0.0.1")
    expect(row).to_contain_text("failed: 127.0.0.1 resolves to a loopback address")


def test_an_escalated_request_says_so_in_its_chat_and_stays_in_the_queue(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice", escalate_after=0.02, escalate_to=["owner"])  # minutes: 1.2 s
    page = setup.open_page()
    setup.say("run echo hi")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    notice = page.locator("p.notice", has_text="escalated to owner")
    expect(notice).to_have_text("alice's request to run shell_exec has waited 0.02 minutes: escalated to owner",
                                timeout=10_000)
    expect(page.locator("#queue-count")).to_have_text("1")  # escalation decides nothing
    assert len(setup.pending()) == 1


def test_a_grant_for_a_short_time_shows_its_time_left_and_leaves_the_page_when_it_ends(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    world = setup.make_world("alice")
    settings = setup.open_settings()
    setup.say("run echo hi")
    [pending] = wait_until(setup.pending, what="the request")
    until = (datetime.now(UTC) + timedelta(seconds=6)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    decision = json.dumps({"decision": "approve", "scope": "for", "until": until})
    setup.api("POST", f"/api/worlds/{world}/tool-results",
              {"role": "tool", "tool_call_id": pending["id"], "content": decision})
    row = settings.locator("#grants li")
    expect(row).to_have_count(1, timeout=5_000)  # the grant_added fragment, live
    expect(row.locator("time.grant-left")).to_have_text("1 min left")
    expect(row).to_have_count(0, timeout=20_000)  # its grant_expired reached the page: removed by itself
    assert setup.api("GET", f"/api/worlds/{world}/grants") == []
    assert [e["grant_id"] for e in setup.api("GET", f"/api/worlds/{world}/events?after=0")
            if e.get("kind") == "grant_expired"]
