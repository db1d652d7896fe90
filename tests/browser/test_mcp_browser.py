"""Elicitation in Chromium (issue #15): an MCP server's question appears in the approval queue as a form,
is validated, survives a reload, and one member's answer closes it on every screen; the tool's result
reflects the answer. Against a real `agent-world serve` and a real MCP server (sandboxed)."""
from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import expect

from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import reply_by_turn, tool_calls

TROUBLE = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")


def test_an_elicitation_form_is_validated_kept_over_a_reload_and_closed_everywhere(world_setup: WorldSetup) -> None:
    world_setup.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                  "tools": {"book": {"approval": "never"}}}])
    world_setup.llm.respond_with(reply_by_turn(lambda: tool_calls(("t__book", {}))))
    owner = world_setup.open_page("owner")
    teammate = world_setup.open_page("member", "max")
    world_setup.say("book a table")
    for page in (owner, teammate):
        expect(page.locator("#queue-count")).to_have_text("1", timeout=20_000)
    teammate.reload()  # a pending question is still there after a reload
    teammate.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(teammate.locator("#approval-list [data-elicitation]")).to_have_count(1)

    owner.locator("#queue-indicator").click()
    form = owner.locator("#approval-list form[data-elicitation-form]")
    expect(form).to_be_visible()
    form.locator('input[name="guests"]').fill("0")  # below the schema's minimum
    form.locator('input[name="email"]').fill("max@example.com")
    form.locator('button[data-elicit="accept"]').click()
    expect(form.locator(".elicit-error")).to_be_visible()
    form.locator('input[name="guests"]').fill("4")
    form.locator('input[name="vegetarian"]').check()
    form.locator('button[data-elicit="accept"]').click()

    for page in (owner, teammate):  # the answer closes the item on every screen
        expect(page.locator("#approval-list [data-elicitation]")).to_have_count(0, timeout=10_000)

    def result() -> str | None:
        events = world_setup.api("GET", f"/api/worlds/{world_setup.world}/events?after=0")
        items = events["events"] if isinstance(events, dict) else events
        return next((e["content"] for e in items if e.get("role") == "tool" and e.get("name") == "t__book"), None)
    assert wait_until(result, 20, what="the tool's result") == "booked for 4 (max@example.com, vegetarian=True)"
