"""Deciding together in the page (issue #16): edit before approve, and the two-person rule, in Chromium."""
from __future__ import annotations

import json

from playwright.sync_api import expect

from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import run_on_request


def test_edit_and_approve_runs_the_edited_command(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    page = setup.open_page()
    setup.say("run echo as-asked")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    page.locator("#queue-indicator").click()
    request = page.locator("#approval-list > .approval").first
    request.locator("details.edit summary").click()
    field = request.locator("textarea[name=edit][data-arg=command]")
    expect(field).to_have_value("echo as-asked")
    field.fill("echo as-edited")
    request.locator("button[data-choice=approve_edited]").click()
    expect(page.locator("#queue-count")).to_have_text("0", timeout=10_000)
    results = [e for e in setup.api("GET", f"/api/worlds/{setup.world}/events")
               if e.get("role") == "tool" and not e.get("decision")]
    for _ in range(100):
        if results:
            break
        page.wait_for_timeout(100)
        results = [e for e in setup.api("GET", f"/api/worlds/{setup.world}/events")
                   if e.get("role") == "tool" and not e.get("decision")]
    [result] = results
    assert json.loads(result["content"])["output"] == "as-edited\n"
    assert result["edited"]["by"] == "human:owner" and result["edited"]["changed"] == ["command"]
    # The chat says what ran, and what was asked: in the live step and on a page loaded afresh (issue #28).
    says = "alice ran echo as-edited (edited by owner from echo as-asked)"
    expect(page.locator(".log .step .step-head").first).to_have_text(says, timeout=10_000)
    page.reload()
    expect(page.locator(".log .step .step-head").first).to_have_text(says, timeout=10_000)


def test_two_approvals_show_live_on_every_screen_and_only_the_second_runs(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    setup.api("POST", f"/api/worlds/{setup.world}/rules",
              {"tool": "shell_exec", "match": {"command": "rm *"}, "effect": "ask", "approvals_required": 2})
    maria = setup.open_page("member", "maria")
    dana = setup.open_page("member", "dana")
    setup.say("run rm -f nothing-here")
    for page in (maria, dana):
        expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
        expect(page.locator("#approval-list .votes")).to_contain_text("0 of 2 approvals")
    maria.locator("#queue-indicator").click()
    maria.locator("#approval-list > .approval button[data-choice=approve_once]").first.click()
    for page in (maria, dana):  # the request stays, with who approved so far
        expect(page.locator("#approval-list .votes")).to_have_text("1 of 2 approvals: maria", timeout=10_000)
        expect(page.locator("#queue-count")).to_have_text("1")
    assert not [e for e in setup.api("GET", f"/api/worlds/{setup.world}/events") if e.get("instance")]
    dana.locator("#queue-indicator").click()
    dana.locator("#approval-list > .approval button[data-choice=approve_once]").first.click()
    for page in (maria, dana):
        expect(page.locator("#queue-count")).to_have_text("0", timeout=10_000)
    starts = [e for e in setup.api("GET", f"/api/worlds/{setup.world}/events") if e.get("instance")]
    assert len(starts) == 1 and starts[0]["decision"]["voters"] == ["human:maria", "human:dana"]


def test_the_asker_is_who_asked_the_agent_and_a_quorum_out_of_reach_says_so(world_setup: WorldSetup) -> None:
    """The owner speaks to carol, then maria asks dave to delete under a two-person rule: maria asked for it,
    the owner did not; and with only those two people, every screen says it can only be denied."""
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("carol", "dave")
    setup.api("POST", f"/api/worlds/{setup.world}/rules",
              {"tool": "shell_exec", "match": {"command": "rm *"}, "effect": "ask", "approvals_required": 2})
    owner = setup.open_page()
    maria = setup.open_page("member", "maria")
    setup.say("@carol hello")
    maria.fill("#say textarea", "@dave run rm -f nothing-here")
    maria.press("#say textarea", "Enter")
    short = "needs 2 approvers; only 1 other person can approve: it can only be denied"
    for page in (owner, maria):
        expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
        expect(page.locator("#approval-list .quorum-short")).to_have_text(short)
    maria.locator("#queue-indicator").click()
    maria.locator("#approval-list > .approval button[data-choice=approve_once]").first.click()
    expect(maria.locator("#toasts")).to_contain_text("you asked for this call", timeout=10_000)
    owner.locator("#queue-indicator").click()
    owner.locator("#approval-list > .approval button[data-choice=approve_once]").first.click()
    for page in (owner, maria):  # the owner asked carol, not dave: hers is the first of two approvals
        expect(page.locator("#approval-list .votes")).to_have_text("1 of 2 approvals: owner", timeout=10_000)
