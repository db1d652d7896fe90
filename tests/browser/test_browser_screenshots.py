"""The screenshots of issue #31's Show, each taken after checking that what it shows is there: the inbox, the
files panel, a file write's diff in the queue, and a regenerated reply with its versions. A plain run writes
them to test-results/ (git ignores it); `./dev screenshots` writes them to docs/screenshots on purpose."""
from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Page, expect

from server.testing.openai_double import Text
from tests.browser.test_browser import SCREENSHOTS, open_queue
from tests.browser.test_browser_inbox import open_inbox
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import reply_by_turn, run_on_request, tool_calls
from tests.fixtures.eventually import eventually

CALC = "def total(items):\n    return sum(items)\n"
CALC_AGAIN = ('def total(items):\n    """The sum of items, 0 when there are none."""\n    return sum(items, 0)\n\n\n'
              'def mean(items):\n    return total(items) / len(items) if items else 0\n')


def shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(300)  # let transitions and fonts settle: the image is for people
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def test_screenshot_of_the_inbox_with_requests_from_two_worlds(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    setup.say("run git status --short")
    # Its request first (the inbox lists the oldest first): the second world's LLM call may be answered sooner.
    eventually(setup.pending, timeout=10, what="the first world's request")
    setup.make_world("bob")
    setup.say("run pytest -q tests/unit")
    page = open_inbox(setup)
    items = page.locator(".inbox-item")
    expect(items).to_have_count(2, timeout=10_000)
    expect(items.locator(".arg-value")).to_have_text(["git status --short", "pytest -q tests/unit"])
    expect(page).to_have_title("(2) Inbox — Agent World")
    shoot(page, "inbox")


def test_screenshot_of_the_files_panel_after_an_agent_wrote_a_file(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    workspace: Path = setup.server.data_dir / "workspaces" / setup.world
    (workspace / "src").mkdir(parents=True, exist_ok=True)
    (workspace / "src" / "calc.py").write_text(CALC)
    (workspace / "README.md").write_text("# Calc\n\nA tiny calculator.\n")
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "file_write", "effect": "allow"})
    setup.llm.respond_with(reply_by_turn(
        tool_calls(("file_write", {"path": "NOTES.md", "content": "# Release notes\n\n- `total` of nothing is 0\n"}),
                   text="I'll keep the release notes in the workspace."),
        Text("Written: **NOTES.md** is in the files panel.")))
    page = setup.open_page("member", "maria")
    page.fill("#say textarea", "@alice start the release notes")
    page.press("#say textarea", "Enter")
    expect(page.locator("#log-main")).to_contain_text("Written: NOTES.md is in the files panel.", timeout=15_000)
    names = page.locator("#files-list .file-name")
    expect(names).to_contain_text(["src/", "NOTES.md", "README.md"], timeout=10_000)
    expect(page.locator("#log-main a.file-link", has_text="NOTES.md")).to_have_count(1)
    shoot(page, "files")
    names.filter(has_text="src/").click()
    expect(names.filter(has_text="calc.py")).to_have_count(1, timeout=10_000)
    names.filter(has_text="calc.py").click()
    expect(page.locator("#file-dialog pre.highlight span.k").first).to_have_text("def")


def test_screenshot_of_a_file_write_diff_in_the_queue(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    # The first write runs (a rule allows exactly that content), so the second one changes an existing file.
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "file_write", "effect": "allow",
                                                           "match": {"path": "calc.py", "content": CALC}})
    setup.llm.queue(tool_calls(("file_write", {"path": "calc.py", "content": CALC}), text="A first version."),
                    tool_calls(("file_write", {"path": "calc.py", "content": CALC_AGAIN}),
                               text="Now the empty case, and a mean."),
                    Text("written"))
    page = setup.open_page("member", "maria")
    page.fill("#say textarea", "@alice write calc.py")
    page.press("#say textarea", "Enter")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=15_000)
    open_queue(page)
    diff = page.locator(".approval.current figure.diff")
    expect(diff.locator("figcaption")).to_have_text("Changes to calc.py")
    expect(diff.locator(".diff-del")).to_have_text(["-    return sum(items)"])
    expect(diff.locator(".diff-add .k", has_text="def").first).to_be_visible()
    shoot(page, "diff")


def test_screenshot_of_a_regenerated_reply_and_its_versions(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text("Ship on **Friday**: the tests are green."),
                    Text("Ship on **Thursday**, before the freeze; the tests are green."),
                    Text("Ship **Thursday morning**: the tests are green and the changelog is ready."))
    page = setup.open_page("member", "maria")
    page.fill("#say textarea", "@alice when should we ship?")
    page.press("#say textarea", "Enter")
    shown = page.locator("#log-main article.item-agent:visible")
    expect(shown.locator(".md")).to_contain_text(["Friday"], timeout=15_000)
    for day in ("Thursday,", "Thursday morning"):
        shown.get_by_role("button", name=re.compile("^Regenerate alice's reply")).click()
        expect(shown.locator(".md")).to_contain_text([day], timeout=15_000)
    shown.get_by_role("button", name="Earlier version of alice's reply").click()
    expect(shown.locator(".versions")).to_contain_text("version 2 of 3")
    expect(shown.locator(".superseded-tag")).to_have_text("superseded by version 3")
    shoot(page, "versions")
