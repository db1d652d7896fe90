"""Accessibility (#14 item 15, #31): axe-core (axe-playwright-python) finds no serious or critical violation
on the world page (its queue, its files panel with a preview open), its audit page, the worlds list and the
inbox, in the light and the dark theme, on a desktop and a phone; controls are labelled."""
from __future__ import annotations

from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe  # type: ignore[import-untyped]  # ships no type hints
from playwright.sync_api import Page, expect

from server.testing.openai_double import Text
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import tool_calls

AXE = Axe()


def check(page: Page, what: str) -> None:
    found = serious(page)
    assert not found, f"{what}:\n" + "\n".join(found)


def serious(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, one line per element."""
    results: Any = AXE.run(page)
    return [f"{v['id']} ({v['impact']}): {v['help']} — {node['target']} {node.get('failureSummary', '')}"
            for v in results.response["violations"] if v["impact"] in ("serious", "critical")
            for node in v["nodes"]]


# Long output: 60 lines of code in alice's answer and 300 of her command's, each scrolling in its own box.
CODE = "```python\n" + "".join(f"print('line {i}')\n" for i in range(60)) + "```"
PHONE = {"width": 390, "height": 844}


@pytest.mark.parametrize(("theme", "viewport"), [("light", None), ("dark", None), ("light", PHONE), ("dark", PHONE)],
                         ids=["light", "dark", "light-390x844", "dark-390x844"])
def test_no_serious_or_critical_violation_on_the_world_files_audit_worlds_and_inbox_pages(
        world_setup: WorldSetup, theme: str, viewport: dict[str, int] | None) -> None:
    setup = world_setup
    setup.make_world("alice", "bob")
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "shell_exec", "match": {"command": "seq *"},
                                                           "effect": "allow"})
    setup.llm.respond_with(lambda body: Text("Done: **all green**.\n\n" + CODE)
                           if body["messages"][-1]["role"] == "tool"
                           else tool_calls(("shell_exec", {"command": "seq 1 300" if "You are alice" in
                                                           body["messages"][0]["content"] else "rm -rf x"})))
    size: dict[str, Any] = {"viewport": viewport} if viewport else {}
    page = setup.open_page("owner", color_scheme=theme, **size)
    page.fill("#say textarea", "status?")
    page.press("#say textarea", "Enter")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)  # bob's rm waits for a decision
    expect(page.locator("#log-main pre.highlight")).to_have_count(1, timeout=10_000)  # alice's answer
    step = page.locator("#log-main details.step", has_text="seq 1 300")
    step.locator("summary").click()  # her command's output, open
    terminal = step.locator("pre.terminal")
    expect(terminal).to_be_visible()
    # Each long output scrolls, and takes focus to be scrolled by keyboard.
    for pre in (terminal, page.locator("#log-main pre.highlight")):
        assert pre.evaluate("p => p.scrollHeight > p.clientHeight")
        expect(pre).to_have_attribute("tabindex", "0")
        assert pre.get_attribute("aria-label")
    check(page, "world page")

    page.locator("#queue-indicator").click()  # the queue dialog, open
    expect(page.locator("#approval-modal")).to_be_visible()
    check(page, "world page with the approval queue open")
    page.keyboard.press("Escape")

    workspace = setup.server.data_dir / "workspaces" / setup.world
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.md").write_text("# Notes\n\nAll **green**.\n")
    page.reload()  # the panel lists the workspace as it is now
    if viewport:  # on a phone the files panel is in the drawer
        page.locator("#drawer-toggle").click()
    page.locator("#files-list .file-name", has_text="notes.md").click()
    expect(page.locator("#file-dialog h1")).to_have_text("Notes", timeout=10_000)
    check(page, "world page with the files panel and a preview open")
    page.keyboard.press("Escape")

    page.goto(f"{setup.server.url}/w/{setup.world}/audit")
    check(page, "audit page")
    page.goto(f"{setup.server.url}/")
    check(page, "worlds list")
    page.goto(f"{setup.server.url}/inbox")
    expect(page.locator(".inbox-item")).to_have_count(1, timeout=10_000)  # bob's request
    check(page, "inbox")


def test_controls_are_labelled_one_by_one_and_a_skip_link_leads_to_the_conversation(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice", "bob")
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "shell_exec", "match": {"command": "ls *"},
                                                           "effect": "allow"})
    page = setup.open_settings()  # the owner's administration is the settings view's
    for name in ("Edit alice", "Edit bob", "Revoke the allow rule of shell_exec (command ~ ls *)", "Dark mode"):
        assert page.get_by_role("button", name=name, include_hidden=True).count() + \
            page.locator(f"summary[aria-label='{name}']").count() == 1, name
    page = setup.open_page("owner")
    for name in ("Stop alice", "Dark mode"):
        assert page.get_by_role("button", name=name, include_hidden=True).count() == 1, name
    box = page.locator("#say textarea")
    expect(box).to_be_focused()  # the message box, from the start
    # The skip links are the page's first stops: one back to the message box, one to the conversation.
    first = page.evaluate("""() => document.querySelector(
        'a[href], button:not([disabled]), textarea, input:not([type=hidden]), select, summary').textContent""")
    assert first == "Skip to the message box"
    to_box = page.get_by_role("link", name="Skip to the message box")
    to_box.focus()
    expect(to_box).to_be_in_viewport()
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to the conversation")
    expect(skip).to_be_focused()
    expect(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    expect(page.locator("#log-main")).to_be_focused()
    to_box.focus()
    page.keyboard.press("Enter")
    expect(box).to_be_focused()
    # aria-live is on the conversation (new messages) and the approval announcement only, never on streaming text.
    live = page.eval_on_selector_all("[aria-live]", "els => els.map(e => e.id + ':' + e.getAttribute('aria-live'))")
    assert sorted(live) == ["log-main:polite", "toasts:assertive"], live
    assert page.locator("#queue-announce[role=status]").count() == 1
