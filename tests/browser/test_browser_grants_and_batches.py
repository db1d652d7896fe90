"""Issue #32 in Chromium against a real `agent-world serve`: a grant for a time (its time left shown, and
revoked), batch decisions that show and decide exactly what they list, and who may still decide."""
from __future__ import annotations

from playwright.sync_api import expect

from tests.browser.test_browser_approvals import ask_alice, open_with_badge
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup, sign_in
from tests.fixtures.engine import run_on_request


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


def test_each_request_says_who_may_still_decide_it(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    urls = {name: setup.api("POST", f"/api/worlds/{setup.world}/invites", {"role": "member", "name": name})["url"]
            for name in ("maria", "joe")}
    setup.api("POST", f"/api/worlds/{setup.world}/rules",
              {"tool": "shell_exec", "effect": "ask", "approvals_required": 2})
    page = setup.open_page()
    setup.say("run echo two")  # the owner asked: under the two-person rule, not one of its approvers
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    open_with_badge(page)
    # Nobody but the owner is signed in: presence is not needed.
    expect(page.locator(".approval.current .who-decides")).to_have_text("needs 2 of joe, maria")
    context = setup.browser.new_context(viewport={"width": 1280, "height": 800})
    setup.contexts.append(context)
    joe = context.new_page()
    sign_in(joe, urls["joe"])  # joe's own invite: the same person the list names
    joe.goto(f"{setup.server.url}/w/{setup.world}")
    joe.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(joe.locator("#queue-count")).to_have_text("1", timeout=10_000)
    open_with_badge(joe)
    expect(joe.locator(".approval.current .who-decides")).to_have_text("needs 2 of joe, maria")
    joe.locator('.approval.current button[data-choice="approve_once"]').click()
    expect(page.locator(".approval.current .who-decides")).to_have_text("needs 1 of maria", timeout=5_000)


def test_approve_all_lists_the_calls_it_decides_and_leaves_one_asked_after(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice", "bob", "carol", "dave")
    # One chat each: an agent whose turn ends never goes on to another's request.
    chats = {a: setup.make_chat(a) for a in ("alice", "bob", "carol", "dave")}
    page = setup.open_page()
    for agent in ("alice", "bob", "carol"):
        setup.say(f"@{agent} run echo {agent}", chat=chats[agent])
    expect(page.locator("#queue-count")).to_have_text("3", timeout=10_000)
    open_with_badge(page)
    approve_all = page.locator('#batch button[data-batch="approve_once"]')
    expect(approve_all).to_have_text("Approve all 3")
    approve_all.click()
    expect(page.locator("#confirm-text")).to_have_text("Approve these 3 calls, each once?")
    lines = page.locator("#confirm-list li")
    expect(lines).to_have_count(3)
    for agent in ("alice", "bob", "carol"):
        expect(page.locator("#confirm-list")).to_contain_text(f"{agent} · shell_exec · command: echo {agent}")
    setup.say("@dave run echo dave", chat=chats["dave"])  # arrives while the confirmation shows
    expect(page.locator("#queue-count")).to_have_text("4", timeout=10_000)
    expect(lines).to_have_count(3)  # the list shown is what is decided
    page.locator("#confirm-yes").click()
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    [left] = setup.pending()
    assert (left["agent"], left["request"]["toolArguments"]) == ("dave", {"command": "echo dave"})
    events = setup.api("GET", f"/api/worlds/{setup.world}/events")
    decisions = [e for e in events if e.get("decision")]
    assert sorted(e["agent"] for e in decisions) == ["alice", "bob", "carol"]  # each on the record
    assert {e["decision"]["scope"] for e in decisions} == {"once"}
