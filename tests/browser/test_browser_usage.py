"""Usage (#14 item 17): the page shows the tokens each agent and the whole world used, summed from the log."""
from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from server.testing.openai_double import Text
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup


def test_the_page_shows_tokens_per_agent_and_per_world(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice", "bob")
    setup.llm.respond_with(lambda body: Text("a short answer"))
    setup.say("hello both")
    setup.say("@alice once more")

    def summed() -> dict[str, Any] | None:  # once the server has handled all three replies
        usage = setup.api("GET", f"/api/worlds/{setup.world}")["usage"]
        return usage if usage["world"]["replies"] == 3 else None
    usage = wait_until(summed, what="three replies counted")
    events = setup.api("GET", f"/api/worlds/{setup.world}/events?after=0")
    replies = [e for e in (events["events"] if isinstance(events, dict) else events) if e.get("role") == "assistant"]
    assert sum(e["usage"]["total_tokens"] for e in replies) == usage["world"]["total_tokens"]

    page = setup.open_page("member", "mia")
    alice, bob = usage["agents"]["alice"], usage["agents"]["bob"]
    expect(page.locator("#usage-alice")).to_have_text(
        f"{alice['total_tokens']:,} tokens ({alice['prompt_tokens']:,} in · {alice['completion_tokens']:,} out) "
        "in 2 replies")
    expect(page.locator("#usage-bob")).to_contain_text(f"{bob['total_tokens']:,} tokens")
    expect(page.locator("#usage-bob")).to_contain_text("in 1 reply")
    expect(page.locator("#world-usage")).to_have_text(f"{usage['world']['total_tokens']:,} tokens")
