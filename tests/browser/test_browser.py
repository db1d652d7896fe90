"""The browser app in Debian's Chromium against a real `agent-world serve` (issue 4's six scenarios)."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import Dialog, Page, expect

from server.testing.openai_double import Text
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import tool_calls

ROOT = Path(__file__).resolve().parents[2]
# Tests write screenshots where git ignores them; `./dev screenshots` points this at docs/screenshots on purpose.
SCREENSHOTS = Path(os.environ.get("AGENT_WORLD_SCREENSHOTS") or ROOT / "test-results" / "screenshots")
XSS = '<img src=x onerror=alert(1)> <script>alert("boom")</script>'


def agent_of(body: dict[str, Any]) -> str:
    """Which agent the double is answering: their system prompt is "You are <name>."."""
    prompt: str = body["messages"][0]["content"]
    return prompt.removeprefix("You are ").rstrip(".")


def shell_then_reply(body: dict[str, Any]) -> Any:
    """Each agent runs `echo <agent>-<n>` for the n-th human message, then says what came back."""
    agent, last = agent_of(body), body["messages"][-1]
    if last["role"] == "tool":
        return Text(f"{agent} got {last['content'][:120]}")
    n = sum(1 for m in body["messages"] if m["role"] == "user")
    return tool_calls(("shell_exec", {"command": f"echo {agent}-{n}"}))


def dom_ids(page: Page, selector: str) -> list[str]:
    ids: list[str] = page.eval_on_selector_all(selector, "els => els.map(e => e.id)")
    return ids


def current_agent(page: Page) -> str:
    return page.locator("#approval-list > .approval.current").get_attribute("data-agent") or ""


def open_queue(page: Page) -> None:
    """The deliberate act that opens the queue: a click on the pending badge."""
    page.locator("#queue-indicator").click()
    expect(page.locator("#approval-modal")).to_be_visible()


def test_two_agents_approvals_queue_deny_with_reason_and_session_grant(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(shell_then_reply)
    setup.make_world("alice", "bob")
    page = setup.open_page()
    page.fill("#say textarea", "please check the workspace")
    page.press("#say textarea", "Enter")

    modal = page.locator("#approval-modal")
    expect(page.locator("#queue-count")).to_have_text("2", timeout=10_000)
    expect(modal).to_be_hidden()  # requests are signalled, never opened on their own
    assert page.title().startswith("(2) ")
    open_queue(page)
    expect(page.locator("#approval-title")).to_have_text("Approval 1 of 2")

    # Deny alice's with a reason, approve bob's for this chat (after its confirmation), whichever comes first.
    for _ in range(2):
        if current_agent(page) == "alice":
            page.locator(".approval.current input[name=reason]").fill("not on my watch")
            page.locator(".approval.current [data-choice=deny]").click()
        else:
            page.keyboard.press("s")
            page.locator("#confirm-yes").click()
        expect(page.locator("#approval-list > .approval")).to_have_count(1 if _ == 0 else 0, timeout=5_000)
    expect(modal).to_be_hidden()

    log = page.locator("#log-main")
    expect(log).to_contain_text("denied shell_exec: not on my watch", timeout=10_000)
    expect(log).to_contain_text("approved shell_exec for this chat")
    bob_step = log.locator(".step", has_text="echo bob-1")
    expect(bob_step.locator("pre.terminal")).to_have_text("bob-1\n", timeout=10_000)  # the output, as a terminal
    expect(bob_step.locator("summary")).to_contain_text("bob ran echo bob-1 · approved for this chat by owner · exit 0",
                                                      use_inner_text=True)
    expect(log).to_contain_text("bob got", timeout=10_000)  # the LLM's reply to it
    expect(log).to_contain_text("alice got", timeout=10_000)
    expect(log).to_contain_text("not on my watch")

    # bob's second shell call runs under the session grant: no modal, straight to its result.
    page.fill("#say textarea", "@bob once more")
    page.press("#say textarea", "Enter")
    expect(log.locator(".step", has_text="echo bob-2").locator("pre.terminal")).to_have_text("bob-2\n", timeout=10_000)
    expect(modal).to_be_hidden()
    expect(page.locator("#queue-count")).to_have_text("0")
    assert setup.pending() == []


def test_reload_with_three_pending_brings_back_the_queue_without_duplicates(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(shell_then_reply)
    setup.make_world("ann", "ben", "cy")
    page = setup.open_page()
    setup.say("all hands")
    expect(page.locator("#approval-list > .approval")).to_have_count(3, timeout=10_000)
    before = dom_ids(page, "#log-main > article")

    page.reload()
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(page.locator("#queue-count")).to_have_text("3")
    expect(page.locator("#approval-modal")).to_be_hidden()
    open_queue(page)
    expect(page.locator("#approval-title")).to_have_text("Approval 1 of 3")
    agents = {page.locator(f"#approval-list > .approval >> nth={i}").get_attribute("data-agent") for i in range(3)}
    assert agents == {"ann", "ben", "cy"}
    page.keyboard.press("ArrowRight")
    expect(page.locator("#queue-pos")).to_have_text("2")

    time.sleep(0.5)  # let a replay (if any) land before counting
    after = dom_ids(page, "#log-main > article")
    assert len(after) == len(set(after)), f"duplicated messages: {after}"
    assert after == before
    expect(page.locator("#approval-list > .approval")).to_have_count(3)


def test_a_teammates_decision_removes_the_item_from_every_screen_and_names_the_decider(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(shell_then_reply)
    setup.make_world("alice")
    mia = setup.open_page("member", "mia")
    max_ = setup.open_page("member", "max")
    setup.say("go")
    for page in (mia, max_):
        expect(page.locator("#approval-list > .approval")).to_have_count(1, timeout=10_000)
        open_queue(page)

    mia.keyboard.press("o")  # pushed to max's open page: it polls nothing and is never reloaded
    expect(max_.locator("#approval-list > .approval")).to_have_count(0, timeout=10_000)
    expect(max_.locator("#approval-notice")).to_contain_text("mia approved this")  # in max's open dialog
    expect(max_.locator("#approval-notice")).to_contain_text(" s ago")
    expect(mia.locator("#approval-modal")).to_be_hidden()  # mia's own decision emptied her queue
    expect(max_.locator("#log-main")).to_contain_text("mia approved shell_exec once", timeout=5_000)


def test_spectator_sees_the_stream_and_count_but_cannot_decide(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text("Streaming slowly, token by token, for the people watching.", chunk_size=3, delay=0.04),
                    tool_calls(("shell_exec", {"command": "rm -rf build"})))
    sam = setup.open_page("spectator", "sam")
    assert sam.locator("#say").count() == 0

    setup.say("talk to us")
    expect(sam.locator("#log-main article.streaming")).to_have_count(1, timeout=10_000)  # chunks, before the end
    expect(sam.locator("#log-main")).to_contain_text("for the people watching.", timeout=10_000)
    expect(sam.locator("#log-main article.streaming")).to_have_count(0)  # replaced by the stored message

    setup.say("now do it")
    expect(sam.locator("#queue-count")).to_have_text("1", timeout=10_000)
    assert sam.locator("button[data-choice]").count() == 0
    approval_id = setup.pending()[0]["id"]

    # A forged decision over the page's own socket, and one through the JSON API: both refused.
    sam.evaluate("id => agentWorld.send({type: 'decide', approval: id, choice: 'approve_always'})", approval_id)
    expect(sam.locator("#toasts")).to_contain_text("spectator may not", timeout=5_000)
    status = sam.evaluate("""async id => (await fetch(location.origin + '/api/worlds/'
        + document.getElementById('world').dataset.world + '/tool-results',
        {method: 'POST', headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({role: 'tool', tool_call_id: id, content: '{"decision": "approve"}'})})).status""",
                          approval_id)
    assert status == 403
    assert [p["id"] for p in setup.pending()] == [approval_id]
    expect(sam.locator("#queue-count")).to_have_text("1")


def test_markup_from_agents_and_tool_arguments_renders_as_text(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("mallory")
    setup.llm.queue(Text(f"look: {XSS} **bold**"), tool_calls(("shell_exec", {"command": XSS}), text=XSS))
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()
    page = setup.open_page(on_dialog=on_dialog)
    page.fill("#say textarea", f"human says {XSS}")
    page.press("#say textarea", "Enter")
    log = page.locator("#log-main")
    expect(log).to_contain_text("look: <img src=x onerror=alert(1)>", timeout=10_000)
    expect(log.locator("strong")).to_have_text("bold")
    page.fill("#say textarea", "again")
    page.press("#say textarea", "Enter")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    open_queue(page)
    expect(page.locator(".approval.current pre.arg-value")).to_have_text(XSS)  # the argument exactly as written
    expect(page.locator(".approval.current .approval-message")).to_have_text(XSS)
    page.reload()  # the first render takes the same path through the templates
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(log).to_contain_text(f"human says {XSS}")
    for selector in ("#log-main img", "#log-main script", "#approval-list img", "#approval-list script"):
        assert page.locator(selector).count() == 0, selector
    page.wait_for_timeout(300)  # an onerror would have fired by now
    assert dialogs == []


def test_page_reconnects_by_itself_after_a_server_restart(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(shell_then_reply)
    setup.make_world("alice", "bob")
    page = setup.open_page()
    setup.say("@alice start")
    expect(page.locator("#approval-list > .approval")).to_have_count(1, timeout=10_000)

    setup.server.stop()
    expect(page.locator("#connection")).to_have_attribute("data-state", "reconnecting", timeout=5_000)
    setup.server.start()
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=15_000)
    expect(page.locator("#approval-list > .approval")).to_have_count(1)

    setup.say("@bob you too")  # news after the restart reach the same page, no reload
    expect(page.locator("#approval-list > .approval")).to_have_count(2, timeout=10_000)
    expect(page.locator("#queue-count")).to_have_text("2")
    ids = dom_ids(page, "#log-main > article")
    assert len(ids) == len(set(ids))


def test_screenshots_of_the_world_and_the_approval_modal(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(lambda body: (
        Text(f"{agent_of(body)} here: the build is **green**; I'd like to clean up next.")
        if body["messages"][-1]["role"] == "tool" else
        tool_calls(("shell_exec", {"command": "echo all green"}) if agent_of(body) == "alice"
                   else ("file_write", {"path": "NOTES.md", "content": "release checklist"}),
                   text="Checking before I touch anything.")))
    setup.make_world("alice", "bob")
    page = setup.open_page()
    page.fill("#say textarea", "Please prepare the **release**.")
    page.press("#say textarea", "Enter")
    expect(page.locator("#queue-count")).to_have_text("2", timeout=10_000)
    open_queue(page)
    expect(page.locator("#approval-title")).to_have_text("Approval 1 of 2")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "approvals.png"))

    page.keyboard.press("Escape")  # closes without deciding; the queue stays
    expect(page.locator("#approval-modal")).to_be_hidden()
    expect(page.locator("#queue-count")).to_have_text("2")
    assert len(setup.pending()) == 2
    open_queue(page)
    page.keyboard.press("o")
    expect(page.locator("#approval-list > .approval")).to_have_count(1, timeout=5_000)
    page.keyboard.press("o")
    expect(page.locator("#log-main")).to_contain_text("here: the build is", timeout=10_000)
    page.wait_for_timeout(300)
    page.screenshot(path=str(SCREENSHOTS / "world.png"))
    assert setup.pending() == []
