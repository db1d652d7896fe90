"""Deciding reads well (issue #31 item 4), in Chromium on a phone's screen and a laptop's: a file write's diff,
buttons in view, who won a race and when, spectators left alone, Alt+A from the message box, Stop on the
agent's own message."""
from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Page, expect

from server.testing.openai_double import Delay, Text
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import run_on_request, tool_calls

PHONE: dict[str, Any] = {"viewport": {"width": 390, "height": 844}}
FIRST = "def total(items):\n    return sum(items)\n"
# The rewrite: a docstring, a changed line and 60 more, so the request is far taller than a phone's screen.
SECOND = ('def total(items):\n    """The sum of items."""\n    return sum(items, 0)\n'
          + "".join(f"\n\ndef helper_{i}(x):\n    return x + {i}\n" for i in range(20)))


def open_queue(page: Page) -> None:
    page.locator("#queue-indicator").click()
    expect(page.locator("#approval-modal")).to_be_visible()


def a_request_on_two_pages(setup: WorldSetup, first: tuple[str, str], second: tuple[str, str],
                           command: str) -> tuple[Page, Page]:
    """A world where alice asks to run `command`, the request counted on the pages of two people (role, name)."""
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    pages = setup.open_page(*first), setup.open_page(*second)
    setup.say(f"run {command}")
    for page in pages:
        expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    return pages


def test_a_file_write_shows_a_highlighted_diff_or_new_content_and_the_buttons_stay_in_view(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    # The first write runs (a rule allows exactly that content), so the second one changes an existing file.
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "file_write", "effect": "allow",
                                                           "match": {"path": "calc.py", "content": FIRST}})
    setup.llm.queue(tool_calls(("file_write", {"path": "calc.py", "content": FIRST})),
                    tool_calls(("file_write", {"path": "calc.py", "content": SECOND})),
                    tool_calls(("file_write", {"path": "fresh.py", "content": "import os\nprint(os.sep)\n"})),
                    Text("written"))
    page = setup.open_page("member", "maria", **PHONE)
    setup.say("write calc.py")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=15_000)
    open_queue(page)
    request = page.locator(".approval.current")
    diff = request.locator("figure.diff")
    expect(diff.locator("figcaption")).to_have_text("Changes to calc.py")
    expect(diff.locator(".diff-del")).to_have_count(1)  # `return sum(items)`
    expect(diff.locator(".diff-del")).to_have_text("-    return sum(items)")
    added = diff.locator(".diff-add")
    expect(added.first).to_have_text('+    """The sum of items."""')
    # Highlighted as Python: the keyword `def` of an added line is a token of its own.
    expect(diff.locator(".diff-add .k", has_text="def").first).to_be_visible()
    # The whole content is folded under the diff, not shown twice (nor as escaped JSON).
    expect(request.locator("details.arg-folded pre.arg-value")).to_be_hidden()
    assert "\\n" not in request.inner_text()

    # The request is taller than the dialog, and its decision buttons are in view wherever it is scrolled to.
    modal = page.locator("#approval-modal")
    assert modal.evaluate("m => m.scrollHeight > m.clientHeight + 200")
    once = request.locator("button[data-choice=approve_once]")
    expect(once).to_be_in_viewport()
    expect(once).to_be_enabled()
    modal.evaluate("m => { m.scrollTop = m.scrollHeight / 2; }")
    expect(once).to_be_in_viewport()
    diff.locator("figcaption").scroll_into_view_if_needed()
    expect(once).to_be_in_viewport()
    once.click()

    # A new file is its content as it will be written, highlighted: no column of "+".
    # The queue stays open when the next request arrives before it empties, and closes when it empties
    # first. Wait until the next request is the queue's only one (the decided one gone, so the dialog
    # can no longer close by itself), then open it only if closed: a click on the badge behind an open
    # dialog closes it.
    expect(page.locator(".approval figure.diff figcaption")).to_have_text(["New file fresh.py"], timeout=15_000)
    if not modal.is_visible():
        open_queue(page)
    expect(modal).to_be_visible()
    fresh = page.locator(".approval.current figure.diff")
    expect(fresh.locator("figcaption")).to_have_text("New file fresh.py")
    expect(fresh.locator("pre.diff-lines")).to_have_text("import os\nprint(os.sep)\n")
    expect(fresh.locator(".diff-add")).to_have_count(0)
    expect(fresh.locator(".kn", has_text="import")).to_be_visible()


def test_the_race_loser_reads_who_decided_and_how_long_ago_with_no_id(world_setup: WorldSetup) -> None:
    maria, dana = a_request_on_two_pages(world_setup, ("member", "maria"), ("member", "dana"), "echo once")
    for page in (maria, dana):
        open_queue(page)
    approval = dana.locator(".approval.current").get_attribute("data-approval")
    assert approval

    maria.keyboard.press("o")
    notice = dana.locator("#approval-notice")
    expect(notice).to_contain_text(re.compile(r"^maria approved this \d+ s ago\. Nothing else is waiting\.$"),
                                   timeout=10_000)
    # The heading says so, not "Approval - of 0" (with an en dash).
    expect(dana.locator("#approval-title")).to_have_text("Already decided", use_inner_text=True)
    # Dana's own click reached the server just after maria's: refused, and her page says nothing more. (Once
    # alice's turn is over: a stop while the approved call still runs would stop it, and say nothing.)
    expect(dana.locator("#status-alice")).to_have_text("idle", timeout=15_000)
    dana.evaluate("id => agentWorld.send({type: 'decide', approval: id, choice: 'approve_once'})", approval)
    dana.evaluate("() => agentWorld.send({type: 'stop', agent: 'alice'})")  # answered after the decision's reply
    expect(dana.locator("#toasts")).to_contain_text("alice had nothing to stop", timeout=5_000)
    expect(dana.locator("#toasts .toast-error")).to_have_count(0)
    assert approval not in dana.locator("#toasts").inner_text()
    # The time it tells goes on: seconds later, it says so.
    expect(notice).to_contain_text(re.compile(r"maria approved this ([3-9]|\d\d) s ago"), timeout=10_000)


def test_a_spectator_sees_requests_without_the_urgent_badge_sound_or_notifications(world_setup: WorldSetup) -> None:
    sam, maria = a_request_on_two_pages(world_setup, ("spectator", "sam"), ("member", "maria"), "echo watched")
    expect(maria.locator("#queue-indicator")).to_have_class(re.compile(r"\bhas-pending\b"))
    assert maria.title().startswith("(1) ")
    indicator = sam.locator("#queue-indicator")
    expect(indicator).not_to_have_class(re.compile(r"\b(has-pending|arrived)\b"))
    assert not sam.title().startswith("(")
    expect(sam.locator("#sound-toggle")).to_have_count(0)
    expect(sam.locator("#notify-toggle")).to_have_count(0)
    open_queue(sam)  # the request is there to read
    expect(sam.locator(".approval.current")).to_contain_text("alice wants to run shell_exec")
    expect(sam.locator(".approval.current")).to_contain_text("A member decides this one.")


def test_alt_a_opens_the_queue_from_the_message_box_and_decides_nothing(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    page = setup.open_page("member", "maria")
    box = page.locator("#say textarea")
    box.fill("run echo from-the-box")
    box.press("Enter")  # sent: focus stays in the box
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    expect(box).to_be_focused()
    page.keyboard.press("Alt+a")
    expect(page.locator("#approval-modal")).to_be_visible()
    expect(page.locator("#approval-modal")).to_be_focused()  # the dialog, not a button
    expect(box).to_have_value("")
    assert len(setup.pending()) == 1
    page.keyboard.press("Escape")
    # Another text field keeps its Alt+A.
    title = page.get_by_role("textbox", name="New chat title")
    title.click()
    page.keyboard.press("Alt+a")
    expect(page.locator("#approval-modal")).to_be_hidden()
    assert len(setup.pending()) == 1


def stop_on_message(page: Page, agent: str) -> Any:
    return page.locator(f"#log-main [data-stop={agent}]")


def test_stop_is_on_the_streaming_and_the_thinking_message_on_a_phone(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    slow = " ".join(f"word{i}" for i in range(400))
    # (the double answers one request at a time: the one that never answers comes last)
    setup.llm.queue(Text(slow, chunk_size=3, delay=0.03), Delay(60, Text("never")))
    page = setup.open_page("member", "maria", **PHONE)
    expect(page.locator("#sidebar")).not_to_be_in_viewport()  # the sidebar is a closed drawer here

    setup.say("talk")
    expect(page.locator("#log-main article.streaming")).to_have_count(1, timeout=10_000)
    expect(page.locator("#log-main")).to_contain_text("word5", timeout=10_000)
    stop = page.locator("#log-main article.streaming [data-stop=alice]")
    expect(stop).to_be_in_viewport()
    stop.click()
    expect(page.locator("#log-main")).to_contain_text("(stopped by maria)", timeout=10_000)
    expect(stop_on_message(page, "alice")).to_have_count(0)

    setup.say("think first")
    thinking = page.locator("#working-alice")
    expect(thinking).to_contain_text("alice thinking…", timeout=10_000)
    stop = stop_on_message(page, "alice")
    expect(stop).to_be_in_viewport()
    stop.click()
    expect(page.locator("#status-alice")).to_have_text("idle", timeout=10_000)
    expect(thinking).to_have_count(0)
    expect(page.locator("#log-main .item-agent", has_text="stopped by maria")).to_have_count(2)
