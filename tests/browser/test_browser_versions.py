"""Edit, regenerate, branch in the page (#31 item 5): a person edits their message (both versions shown,
the reply made again), regenerates a reply (the earlier versions kept and browsable in place), and branches
a chat."""
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
    expect(newest.locator(".versions")).to_contain_text("version 2 of 2")
    newest.get_by_role("button", name="Earlier version of alice's reply").click()
    expect(log.locator("article.item-agent:visible .md")).to_have_text(["four", "five"])
    expect(log.locator("article.item-agent .md:not([id])")).to_have_text(["four", "five", "five, again"])
    log.get_by_role("button", name="Later version of alice's reply").click()

    page.reload()  # the same from the log
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(log.locator("article.item-human .md")).to_have_text(["what is 2+2?", "what is 2+3?"])
    expect(log.locator("article.item-agent").last.locator(".versions")).to_contain_text("version 2")

    log.locator("article.item-agent").last.get_by_role("button", name=re.compile("^Branch a new chat")).click()
    page.wait_for_url(re.compile(r"\?chat=chat_"), timeout=10_000)
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    branch = page.locator("article.item-human .md, article.item-agent .md")
    expect(branch).to_have_text(["what is 2+3?", "five, again"], timeout=10_000)


def test_a_reply_regenerated_twice_browses_its_versions_in_place_on_every_page(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text("first try"), Text("second try"), Text("third try"))
    page = setup.open_page("member", "mia")
    watcher = setup.open_page("spectator", "sam")  # another screen, live all along
    page.fill("#say textarea", "@alice a haiku please")
    page.press("#say textarea", "Enter")
    log = page.locator("#log-main")
    shown = log.locator("article.item-agent:visible")
    expect(shown.locator(".md")).to_have_text(["first try"], timeout=15_000)

    for answer in ("second try", "third try"):
        shown.get_by_role("button", name=re.compile("^Regenerate alice's reply")).click()
        expect(shown.locator(".md")).to_have_text([answer], timeout=15_000)
    versions = shown.get_by_role("group", name="Versions of alice's reply")
    expect(versions).to_contain_text("version 3 of 3")
    expect(log.locator("article.item-agent")).to_have_count(3)  # all kept, one shown
    expect(shown.locator(".superseded-tag")).to_have_count(0)
    expect(shown.get_by_role("button", name="Later version of alice's reply")).to_be_disabled()

    shown.get_by_role("button", name="Earlier version of alice's reply").click()
    expect(shown.locator(".md")).to_have_text(["second try"])
    expect(shown.locator(".versions")).to_contain_text("version 2 of 3")
    expect(shown.locator(".superseded-tag")).to_have_text("superseded by version 3")
    page.keyboard.press("Enter")  # focus stayed on the arrow: the keyboard goes on browsing
    expect(shown.locator(".md")).to_have_text(["first try"])
    expect(shown.locator(".versions")).to_contain_text("version 1 of 3")
    expect(shown.get_by_role("button", name="Earlier version of alice's reply")).to_be_disabled()
    expect(shown.get_by_role("button", name="Later version of alice's reply")).to_be_focused()
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    expect(shown.locator(".md")).to_have_text(["third try"])
    expect(shown.locator(".versions")).to_contain_text("version 3 of 3")

    other = watcher.locator("#log-main article.item-agent:visible")  # the count followed there, live
    expect(other.locator(".md")).to_have_text(["third try"], timeout=10_000)
    expect(other.locator(".versions")).to_contain_text("version 3 of 3")
    other.get_by_role("button", name="Earlier version of alice's reply").click()
    expect(other.locator(".md")).to_have_text(["second try"])

    page.reload()  # the first page, from the log
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(shown.locator(".md")).to_have_text(["third try"])
    expect(shown.locator(".versions")).to_contain_text("version 3 of 3")
    expect(log.locator("article.item-agent.superseded[hidden]")).to_have_count(2)


def test_only_the_sender_of_a_message_is_offered_its_edit(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text("hi mia"), Text("hi dan"))
    mia, dan = setup.open_page("member", "mia"), setup.open_page("member", "dan")
    mia.fill("#say textarea", "hello from mia")
    mia.press("#say textarea", "Enter")
    expect(mia.locator("#log-main article.item-agent .md")).to_have_text("hi mia", timeout=15_000)
    dan.fill("#say textarea", "hello from dan")
    dan.press("#say textarea", "Enter")
    for page, mine, theirs in ((mia, "hello from mia", "hello from dan"), (dan, "hello from dan", "hello from mia")):
        log = page.locator("#log-main")
        expect(log.locator("article.item-human", has_text=theirs)).to_have_count(1, timeout=15_000)
        expect(log.locator("article.item-human", has_text=mine).locator("details.edit summary")).to_be_visible()
        expect(log.locator("article.item-human", has_text=theirs).locator("details.edit")).to_be_hidden()
    mia.reload()  # the same from the log
    mia.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(mia.locator("article.item-human", has_text="hello from dan").locator("details.edit")).to_be_hidden()
    expect(mia.locator("article.item-human", has_text="hello from mia").locator("details.edit summary")).to_be_visible()
