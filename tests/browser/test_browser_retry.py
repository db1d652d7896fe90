"""Retry (#14 item 7) in the page: a failed reply has a Retry button for members (not spectators); it
asks the agent again and the new answer follows, with the retry on the record."""
from __future__ import annotations

import re

from playwright.sync_api import expect

from server.testing.openai_double import Stall, Status, Text
from tests.fixtures.browser import WorldSetup


def test_a_member_retries_a_failed_reply_from_the_page(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Status(401, "Incorrect API key provided"), Text("the retried answer"))
    page = setup.open_page("member", "mia")
    page.fill("#say textarea", "hello?")
    page.press("#say textarea", "Enter")
    log = page.locator("#log-main")
    failed = log.locator("article.item-error")
    expect(failed).to_have_count(1, timeout=15_000)
    spectator = setup.open_page("spectator", "sam")
    expect(spectator.locator("#log-main article.item-error")).to_have_count(1, timeout=10_000)
    expect(spectator.get_by_role("button", name=re.compile("^Retry"))).to_have_count(0)

    failed.get_by_role("button", name=re.compile("^Retry alice's reply")).click()
    expect(log).to_contain_text("mia asked alice to answer again", timeout=10_000)
    expect(log.locator("article.item-agent .md")).to_have_text("the retried answer", timeout=15_000)
    expect(spectator.locator("#log-main article.item-agent .md")).to_have_text("the retried answer", timeout=10_000)

    failed.get_by_role("button", name=re.compile("^Retry alice's reply")).click()  # once only: a toast says why
    expect(page.locator("body")).to_contain_text("has answered since", timeout=10_000)
    page.reload()
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(log).to_contain_text("mia asked alice to answer again")


def test_a_stopped_reply_has_a_retry_button_that_gets_the_whole_answer(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Stall(after_chunks=2, then=Text("never finished")), Text("the whole answer"))
    page = setup.open_page("member", "mia")
    page.fill("#say textarea", "tell me everything")
    page.press("#say textarea", "Enter")
    log = page.locator("#log-main")
    # Stopped mid-reply: once the stalled answer's first words are on the page (stopped while still
    # "thinking", the call may not have reached the LLM, and the retry would get the stalled answer).
    expect(log.locator(".stream-text")).to_contain_text("never", timeout=20_000)
    page.locator("#log-main").get_by_role("button", name="Stop alice").click()  # on her own message
    stopped = log.locator("article.item-agent", has_text="stopped by mia")
    expect(stopped).to_have_count(1, timeout=10_000)
    stopped.get_by_role("button", name=re.compile("^Retry alice's reply")).click()
    expect(log.locator("article.item-agent .md").last).to_have_text("the whole answer", timeout=15_000)
    assert setup.llm.requests[1].body["messages"] == setup.llm.requests[0].body["messages"]
