"""Approvals nobody can make by accident (issue #9, the page): Chromium against a real `agent-world serve`."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

from server.testing.openai_double import Text
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import run_on_request, tool_calls

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-results" / "screenshots"  # git-ignored
MESSAGE = "yes, do it: ask dana to approve all sessions, then deny nothing and say ok. Sounds good? Alright!"


def agent_of(body: dict[str, Any]) -> str:
    prompt: str = body["messages"][0]["content"]
    return prompt.removeprefix("You are ").rstrip(".")


def shell_per_agent(body: dict[str, Any]) -> Any:
    """Each agent asks to run `echo <agent>` when addressed, and says what came back."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Text(f"{agent_of(body)} got it")
    return tool_calls(("shell_exec", {"command": f"echo {agent_of(body)}"}))


def focused_id(page: Page) -> str:
    focused: str = page.evaluate(
        "document.activeElement && document.activeElement.id || document.activeElement.tagName")
    return focused


def decisions_in(page: Page) -> int:
    return page.locator(".log .decision").count()  # the conversation of the chat the page shows (in tool steps)


def open_with_badge(page: Page) -> None:
    page.locator("#queue-indicator").click()
    expect(page.locator("#approval-modal")).to_be_visible()


def ask_alice(setup: WorldSetup, command: str, chat_title: str | None = None,
              open_queue: bool = True) -> tuple[Page, str]:
    """A world where alice asks to run `command` (in a new chat `chat_title`), and a page showing the request."""
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice")
    chat = setup.make_chat(chat_title) if chat_title else "main"
    page = setup.open_page()
    setup.say(f"run {command}", chat=chat)
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    if open_queue:
        open_with_badge(page)
    return page, chat


def screenshot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def test_typing_while_one_then_three_requests_arrive_decides_nothing_and_the_message_arrives_intact(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(shell_per_agent)
    setup.make_world("ann", "ben", "cy", "dee")
    page = setup.open_page()
    box = page.locator("#say textarea")
    box.click()
    third = len(MESSAGE) // 3

    page.keyboard.type(MESSAGE[:third], delay=15)
    setup.say("@ann check")  # a teammate's message through the API: one request arrives mid-typing
    page.keyboard.type(MESSAGE[third:2 * third], delay=40)
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    setup.say("@ben check\n\n@cy check\n\n@dee check")  # then three more
    page.keyboard.type(MESSAGE[2 * third:], delay=40)
    expect(page.locator("#queue-count")).to_have_text("4", timeout=10_000)

    # Nothing took focus or keystrokes: the dialog never opened, the text is exactly what was typed.
    expect(page.locator("#approval-modal")).to_be_hidden()
    assert focused_id(page) == "say-box"  # focus never left the message box
    expect(box).to_have_value(MESSAGE)
    assert page.title().startswith("(4) ")
    assert len(setup.pending()) == 4
    assert decisions_in(page) == 0

    page.keyboard.press("Enter")
    expect(page.locator(".log .item-human").last).to_contain_text(MESSAGE, timeout=10_000)
    expect(box).to_have_value("")
    page.wait_for_timeout(500)
    assert decisions_in(page) == 0
    assert len(setup.pending()) >= 4
    screenshot(page, "typing-while-requests-arrive")


def test_the_queue_opens_only_on_a_deliberate_act_and_keys_act_only_on_the_focused_dialog(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    page, _ = ask_alice(setup, "echo check", open_queue=False)
    modal = page.locator("#approval-modal")
    expect(page.locator("#queue-indicator")).to_have_class(re.compile(r"\bhas-pending\b"))
    expect(page.locator("#queue-indicator")).to_contain_text("Alt+A")  # the shortcut is on the page
    expect(page.locator("#sound-toggle")).to_have_attribute("aria-pressed", "false")  # sound: opt-in
    expect(modal).to_be_hidden()

    # Alt+A does nothing while a text field has focus (but the message box: test_browser_deciding.py)…
    page.get_by_role("textbox", name="New chat title").click()
    page.keyboard.press("Alt+a")
    page.wait_for_timeout(200)
    expect(modal).to_be_hidden()
    # …and opens the queue from anywhere else, with focus on the dialog itself, not a decision button.
    page.locator(".log").click()
    page.keyboard.press("Alt+a")
    expect(modal).to_be_visible()
    assert focused_id(page) == "approval-modal"
    page.keyboard.press("Escape")
    expect(modal).to_be_hidden()
    assert len(setup.pending()) == 1

    open_with_badge(page)
    assert focused_id(page) == "approval-modal"
    # A letter typed into the reason field is text, and one typed on a focused button decides nothing.
    reason = page.locator(".approval.current input[name=reason]")
    reason.click()
    page.keyboard.type("do not")
    expect(reason).to_have_value("do not")
    page.locator(".approval.current [data-choice=approve_once]").focus()
    page.keyboard.press("o")
    page.keyboard.press("d")
    page.wait_for_timeout(300)
    assert len(setup.pending()) == 1
    # Once the dialog itself has focus (a click on its heading), `o` approves once.
    page.locator("#approval-title").click()
    assert focused_id(page) == "approval-modal"
    page.keyboard.press("o")
    expect(page.locator(".log")).to_contain_text("approved shell_exec once", timeout=5_000)
    assert setup.pending() == []


def test_for_this_chat_and_always_need_a_confirmation_that_names_what_they_allow(world_setup: WorldSetup) -> None:
    setup = world_setup
    page, _ = ask_alice(setup, "git status", "Ops")
    current = page.locator(".approval.current")
    expect(current.locator(".chat-name")).to_have_text("Ops")
    confirm, text = page.locator("#approval-confirm"), page.locator("#confirm-text")

    page.keyboard.press("s")
    expect(confirm).to_be_visible()
    expect(text).to_have_text("Allow every shell_exec call in chat Ops, for alice, until the chat ends?")
    assert focused_id(page) == "approval-confirm"  # the question has focus, not its "yes"
    page.keyboard.press("Enter")
    page.keyboard.press("o")  # single keys do nothing while a confirmation is open
    page.keyboard.press("Escape")  # Esc goes back to the request, deciding nothing
    expect(confirm).to_be_hidden()
    expect(page.locator("#approval-modal")).to_be_visible()
    assert len(setup.pending()) == 1

    current.locator("[data-choice=approve_always]").click()
    expect(text).to_have_text("Allow shell_exec calls whose command matches `git status`, with no other argument, "
                              "for every agent in this "
                              "world, until revoked?")
    expect(page.locator("#confirm-wider")).to_be_hidden()
    page.locator("#confirm-no").click()
    expect(confirm).to_be_hidden()
    assert len(setup.pending()) == 1

    # Broadening the pattern is the person's own edit, and the confirmation says so before anything is sent.
    current.locator("[name=match][data-arg=command]").fill("git *")
    page.locator("#approval-title").click()
    page.keyboard.press("a")
    expect(text).to_have_text("Allow shell_exec calls whose command matches `git *`, with no other argument, "
                              "for every agent in this "
                              "world, until revoked?")
    expect(page.locator("#confirm-wider")).to_have_text(
        "Wider than this call: command was `git status`; the pattern is `git *`.")
    screenshot(page, "always-confirmation")
    assert setup.api("GET", f"/api/worlds/{setup.world}/rules") == []
    page.locator("#confirm-yes").click()
    expect(page.locator(".log")).to_contain_text("approved shell_exec always", timeout=5_000)
    # The rule is written just after the decision the log shows.
    rules = wait_until(lambda: setup.api("GET", f"/api/worlds/{setup.world}/rules"), what="the rule")
    assert [(r["tool"], r["match"], r["effect"]) for r in rules] == [("shell_exec", {"command": "git *"}, "allow")]


def test_for_this_chat_after_its_confirmation_grants_the_agent_that_asked(world_setup: WorldSetup) -> None:
    setup = world_setup
    page, ops = ask_alice(setup, "echo one", "Ops")
    page.keyboard.press("s")
    page.locator("#confirm-yes").click()
    expect(page.locator("#queue-count")).to_have_text("0", timeout=5_000)
    grants = setup.api("GET", f"/api/worlds/{setup.world}/grants")
    assert [(g["tool"], g["chat"], g.get("agent")) for g in grants] == [("shell_exec", ops, "alice")]


def test_each_request_shows_its_chat_title_agent_time_and_exact_arguments(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(run_on_request)
    setup.make_world("alice", "bob")
    ops = setup.make_chat("Ops & <Infra>")
    page = setup.open_page()
    secret = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
    setup.say("@alice run ls -la 'my dir'/*.txt", chat="main")
    setup.say(f"@bob run curl -H 'Authorization: Bearer {secret}' https://example.test", chat=ops)
    expect(page.locator("#queue-count")).to_have_text("2", timeout=10_000)
    open_with_badge(page)
    seen = {}
    for _ in range(2):
        item = page.locator(".approval.current")
        agent = item.locator(".agent-badge").inner_text()
        seen[agent] = item
        expect(item.locator(".when")).to_contain_text("asked ")
        assert len(item.locator("time.asked").inner_text()) == 8  # hh:mm:ss
        if agent == "alice":
            expect(item.locator(".chat-name")).to_have_text("Main")
            expect(item.locator("pre.arg-value")).to_have_text("ls -la 'my dir'/*.txt")
            expect(item.locator(".badge-redacted")).to_have_count(0)
        else:
            expect(item.locator(".chat-name")).to_have_text("Ops & <Infra>")
            # The secret is hidden, and marked as hidden; everything around it is shown exactly.
            expect(item.locator("pre.arg-value")).to_have_text(
                "curl -H 'Authorization: Bearer [redacted]' https://example.test")
            expect(item.locator("mark.redacted")).to_have_text("[redacted]")
            expect(item.locator(".badge-redacted")).to_be_visible()
            assert secret not in page.content()
        page.keyboard.press("ArrowRight")
    assert set(seen) == {"alice", "bob"}


def test_a_pattern_prefilled_from_a_glob_call_allows_only_that_call(world_setup: WorldSetup) -> None:
    setup = world_setup
    page, _ = ask_alice(setup, "rm -f build/*.o")
    pattern = page.locator(".approval.current [name=match][data-arg=command]")
    expect(pattern).to_have_value("rm -f build/[*].o")  # the `*` is a literal star, not a wildcard
    page.keyboard.press("a")
    expect(page.locator("#confirm-text")).to_contain_text("whose command matches `rm -f build/[*].o`")
    page.locator("#confirm-yes").click()
    expect(page.locator(".log")).to_contain_text("approved shell_exec always", timeout=5_000)
    rules = setup.api("GET", f"/api/worlds/{setup.world}/rules")
    assert [r["match"] for r in rules] == [{"command": "rm -f build/[*].o"}]

    # The engine applies the rule: the same call again runs without asking…
    setup.say("run rm -f build/*.o")
    expect(page.locator(".log .item-human")).to_have_count(2, timeout=10_000)
    page.wait_for_timeout(1500)
    assert setup.pending() == []
    # …and a call the pattern's text would have covered as a wildcard still asks.
    setup.say("run rm -f build/ -r x.o")
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    pending = setup.pending()
    assert len(pending) == 1 and pending[0]["request"]["toolArguments"] == {"command": "rm -f build/ -r x.o"}


def test_an_offline_page_cannot_decide_and_nothing_it_clicked_is_applied_after_reconnect(
        world_setup: WorldSetup) -> None:
    setup = world_setup
    page, _ = ask_alice(setup, "echo risky", open_queue=False)
    once = page.locator(".approval [data-choice=approve_once]")
    expect(once).to_be_enabled()
    old_conn = page.locator("#page-conn").get_attribute("data-conn")
    assert old_conn

    setup.server.stop()  # the server drops the page's socket
    expect(page.locator("#connection")).to_have_attribute("data-state", "reconnecting", timeout=5_000)
    open_with_badge(page)
    expect(once).to_be_disabled()
    expect(once).to_have_attribute("title", "Not connected to the server. Decisions are off until the page is back.")
    expect(page.locator("#decide-offline")).to_be_visible()
    expect(page.locator("#decide-offline")).to_contain_text("Not connected")
    once.click(force=True)  # a disabled button: nothing happens
    page.locator("#approval-title").click()
    page.keyboard.press("o")
    expect(page.locator("#toasts")).to_contain_text("Not connected: nothing was decided.")
    # The way htmx-ext-ws itself would queue a send made now (a ws-send element), with this page's old id.
    page.evaluate("""([id, conn]) => document.getElementById('world')['htmx-internal-data'].webSocket.send(
        JSON.stringify({type: 'decide', approval: id, choice: 'approve_once', conn: conn}))""",
                  [page.locator(".approval").get_attribute("data-approval"), old_conn])
    page.keyboard.press("Escape")
    # A message typed offline is shown as not sent, with cancel; it waits for its author.
    page.fill("#say textarea", "offline thought")
    page.press("#say textarea", "Enter")
    page.fill("#say textarea", "second thought")
    page.press("#say textarea", "Enter")
    outbox = page.locator("#outbox > li")
    expect(outbox).to_have_count(2)
    expect(outbox.first).to_contain_text("Not sent: the page is offline.")
    expect(outbox.first.locator("[data-outbox-send]")).to_be_disabled()
    outbox.nth(1).locator("[data-outbox-cancel]").click()
    expect(outbox).to_have_count(1)

    setup.server.start()
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=15_000)
    expect(page.locator("#page-conn")).not_to_have_attribute("data-conn", "", timeout=5_000)
    assert page.locator("#page-conn").get_attribute("data-conn") != old_conn
    page.wait_for_timeout(1500)
    assert len(setup.pending()) == 1  # nothing clicked or queued offline was applied…
    expect(page.locator("#toasts")).not_to_contain_text("before the page reconnected")  # …or even sent
    assert decisions_in(page) == 0
    expect(page.locator(".log")).not_to_contain_text("offline thought")
    expect(outbox.first).to_contain_text("The page is back. Send it now?")

    # Belt and braces: a frame that still reaches the server with the earlier connection's id is refused.
    page.evaluate("""([id, conn]) => document.getElementById('world')['htmx-internal-data'].webSocket.sendImmediately(
        JSON.stringify({type: 'decide', approval: id, choice: 'approve_once', conn: conn}))""",
                  [page.locator(".approval").get_attribute("data-approval"), old_conn])
    expect(page.locator("#toasts")).to_contain_text("before the page reconnected", timeout=5_000)
    assert len(setup.pending()) == 1

    outbox.first.locator("[data-outbox-send]").click()  # the person still wants it sent
    expect(page.locator(".log")).to_contain_text("offline thought", timeout=5_000)
    expect(outbox).to_have_count(0)
    expect(page.locator(".log")).not_to_contain_text("second thought")

    open_with_badge(page)  # live again: the same page decides normally
    expect(once).to_be_enabled()
    page.keyboard.press("o")
    expect(page.locator(".log")).to_contain_text("approved shell_exec once", timeout=5_000)
    assert setup.pending() == []
