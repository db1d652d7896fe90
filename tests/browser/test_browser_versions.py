"""Edit, regenerate, branch in the page (#31 item 5): a person edits their message (both versions shown,
the reply made again), regenerates a reply (the earlier version kept and linked), and branches a chat."""
from __future__ import annotations

import re

from playwright.sync_api import expect

from server.testing.openai_double import Text
from tests.fixtures.browser import WorldSetup


def test_edit_regenerate_and_branch_from_the_page(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text("four"), Text("five"), Text("five, again"), Text("in the branch"))
    page = setup.open_page("member", "mia")
    page.fill("#say textarea", "what is 2+2?")
    page.press("#say textarea", "Enter")
    log = page.locator("#log-main")
    expect(log.locator("article.item-agent .md")).to_have_text("four", timeout=15_000)

    said = log.locator("article.item-human", has_text="what is 2+2?")
    said.locator("details.edit summary").click()
    said.locator("details.edit textarea").fill("what is 2+3?")
    said.get_by_role("button", name="Save the new version").click()
    expect(log.locator("article.item-human .md")).to_have_text(["what is 2+2?", "what is 2+3?"], timeout=10_000)
    expect(log.locator("article.item-agent .md", has_text="five")).to_have_count(1, timeout=15_000)

    log.locator("article.item-agent").last.get_by_role("button", name=re.compile("^Regenerate alice's reply")).click()
    expect(log).to_contain_text("mia asked alice for version 2 of its reply", timeout=10_000)
    newest = log.locator("article.item-agent", has_text="five, again").filter(has=page.locator(".versions"))
    expect(newest).to_have_count(1, timeout=15_000)
    expect(newest.locator(".versions")).to_contain_text("version 2")
    newest.get_by_role("link", name=re.compile("^Earlier version")).click()
    expect(page).to_have_url(re.compile("#m-msg_"))
    expect(log.locator("article.item-agent .md:not([id])")).to_have_text(["four", "five", "five, again"])

    page.reload()  # the same from the log
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(log.locator("article.item-human .md")).to_have_text(["what is 2+2?", "what is 2+3?"])
    expect(log.locator("article.item-agent").last.locator(".versions")).to_contain_text("version 2")

    log.locator("article.item-agent").last.get_by_role("button", name=re.compile("^Branch a new chat")).click()
    page.wait_for_url(re.compile(r"\?chat=chat_"), timeout=10_000)
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    branch = page.locator("article.item-human .md, article.item-agent .md")
    expect(branch).to_have_text(["what is 2+3?", "five, again"], timeout=10_000)
