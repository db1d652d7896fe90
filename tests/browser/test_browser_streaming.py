"""A streamed reply reads as Markdown while it streams (issue #30): each finished block is rendered once
and appended, the block still open is rendered with each chunk while it is short, and a page that opens
mid-stream gets the blocks so far.
Chromium against a real `agent-world serve` and the OpenAI double."""
from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from server.testing.openai_double import Stall, Text
from tests.fixtures.browser import WorldSetup

REPLY = ("First paragraph with **bold** words.\n\n"
         "```python\nprint('hi')\n```\n\n"
         "- one\n- two\n\n"
         "Last paragraph, still coming")
# Stalled after the first 17 chunks of 5 characters: up to "Last pa" (a word is shown once it ends).
STALLED_AT = 17


def _shows_blocks_so_far(page: Page) -> None:
    article = page.locator("#log-main article.streaming")
    expect(article.locator(".md p strong")).to_have_text("bold", timeout=20_000)
    expect(article.locator(".md pre.highlight code.language-python")).to_contain_text("print('hi')")
    expect(article.locator(".md li")).to_have_text(["one", "two"])
    expect(article.locator(".stream-text > .md p")).to_have_count(1)  # the committed blocks: one paragraph
    expect(article.locator(".stream-tail .md-open p")).to_have_text(re.compile(r"^Last\b"))  # the open one, after
    assert "```" not in article.inner_text()


def test_a_streamed_reply_shows_its_finished_markdown_blocks_while_it_streams(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Stall(after_chunks=STALLED_AT, then=Text(REPLY, chunk_size=5)), Text(REPLY, chunk_size=5))
    page = setup.open_page("member", "mia")
    page.fill("#say textarea", "write it up")
    page.press("#say textarea", "Enter")
    _shows_blocks_so_far(page)
    _shows_blocks_so_far(setup.open_page("spectator", "sam"))  # opened mid-stream: the same picture

    page.locator("#log-main").get_by_role("button", name="Stop alice").click()  # on her own message
    expect(page.locator("#log-main article.item-agent", has_text="stopped by mia")).to_have_count(1, timeout=10_000)
    page.fill("#say textarea", "again, all of it")
    page.press("#say textarea", "Enter")
    # The whole reply, stored: rendered once as Markdown, nothing left streaming.
    done = page.locator("#log-main article.item-agent").last
    expect(done.locator(".md p").last).to_have_text("Last paragraph, still coming", timeout=20_000)
    expect(done.locator(".md li")).to_have_text(["one", "two"])
    expect(done.locator(".md pre.highlight")).to_contain_text("print('hi')")
    expect(page.locator("#log-main article.streaming")).to_have_count(0)


def _markup(html: str) -> str:
    return re.sub(r">\s+<", "><", html.strip())


def test_a_finished_reply_keeps_the_blocks_the_page_showed_and_reads_as_after_a_reload(
        world_setup: WorldSetup) -> None:
    """The stored reply does not come a second time to a page that watched it stream: its article keeps the
    blocks already shown (the same elements) and appends the last one, the same HTML a reload renders."""
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Stall(seconds=4, after_chunks=STALLED_AT, then=Text(REPLY, chunk_size=5)))
    page = setup.open_page("member", "mia")
    page.fill("#say textarea", "write it up")
    page.press("#say textarea", "Enter")
    _shows_blocks_so_far(page)
    page.evaluate("() => { window.streamedBlocks = document.querySelector('#log-main article.streaming .md'); }")
    done = page.locator("#log-main article.item-agent:not(.streaming)").last
    expect(done.locator(".md p").last).to_have_text("Last paragraph, still coming", timeout=20_000)
    assert page.evaluate("() => window.streamedBlocks.isConnected"
                         " && !window.streamedBlocks.closest('article').classList.contains('streaming')")
    shown = done.locator(".md").inner_html()
    page.reload()
    again = page.locator("#log-main article.item-agent").last
    expect(again.locator(".md p").last).to_have_text("Last paragraph, still coming", timeout=20_000)
    assert _markup(again.locator(".md").inner_html()) == _markup(shown)
