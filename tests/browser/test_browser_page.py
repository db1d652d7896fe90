"""The page a team would choose (issue #14), in Debian's Chromium against a real `agent-world serve`."""
from __future__ import annotations

import os
import re
from pathlib import Path

from playwright.sync_api import Locator, Page, expect

from server.testing.openai_double import Malformed, Text
from tests.browser.test_browser_settings import populated
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import tool_calls
from tests.fixtures.eventually import eventually

# Screenshots go where git ignores them; `./dev screenshots` points this at docs/screenshots on purpose.
SHOTS = Path(os.environ.get("AGENT_WORLD_SCREENSHOTS")
             or Path(__file__).resolve().parents[2] / "test-results" / "screenshots")
SLOW = " ".join(f"word{i}" for i in range(400))  # streams for ~20 s at 3 characters per 0.03 s
SLEEP = "sleep 41.25"  # a command line no other process on the machine has


def stop_button(page: Page, agent: str) -> Locator:
    """The agent's Stop in the sidebar (a streaming message has one too: test_browser_deciding.py)."""
    return page.locator("#sidebar").get_by_role("button", name=f"Stop {agent}")


def say(page: Page, text: str) -> None:
    page.fill("#say textarea", text)
    page.press("#say textarea", "Enter")


def processes_running(command: str) -> list[int]:
    """Pids whose command line contains `command` (the tool's shell and its child)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if command in cmdline and entry.name != str(os.getpid()):
                found.append(int(entry.name))
    return found


def test_a_member_stops_a_streaming_agent_and_the_next_message_starts_a_fresh_turn(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text(SLOW, chunk_size=3, delay=0.03), Text("A fresh answer."))
    mia = setup.open_page("member", "mia")
    say(mia, "tell me everything")
    log = mia.locator("#log-main")
    expect(log.locator("article.streaming")).to_have_count(1, timeout=10_000)
    expect(log).to_contain_text("word5", timeout=10_000)

    stop_button(mia, "alice").click()
    expect(log).to_contain_text("(stopped by mia)", timeout=5_000)
    expect(log.locator("article.streaming")).to_have_count(0)  # the stored, stopped message replaced the stream
    expect(mia.locator("#status-alice")).to_have_text("idle", timeout=5_000)
    expect(stop_button(mia, "alice")).to_be_hidden()  # nothing left to stop
    kept = log.locator("article.item-agent").last.inner_text()
    assert "word1" in kept and "word399" not in kept, kept  # the partial text is kept, the rest never came

    say(mia, "and now briefly")
    expect(log).to_contain_text("A fresh answer.", timeout=10_000)


def test_a_spectator_has_no_stop_button_and_the_server_refuses_its_stop(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text(" ".join(f"w{i}" for i in range(60)) + " the end.", chunk_size=3, delay=0.03))
    sam = setup.open_page("spectator", "sam")
    mia = setup.open_page("member", "mia")
    setup.say("talk")
    expect(sam.locator("#status-alice")).to_have_text("streaming", timeout=10_000)
    expect(stop_button(mia, "alice")).to_be_visible()  # a member sees it meanwhile
    expect(sam.get_by_role("button", name="Stop alice")).to_have_count(0)  # neither beside alice nor on her message

    sam.evaluate("() => agentWorld.send({type: 'stop', agent: 'alice'})")  # forged on the page's own socket
    expect(sam.locator("#toasts")).to_contain_text("a spectator may not stop agents", timeout=5_000)
    expect(sam.locator("#log-main")).to_contain_text("the end.", timeout=15_000)  # the turn ran to its end
    assert "stopped by" not in sam.locator("#log-main").inner_text()


def test_a_running_tool_is_killed_only_after_a_confirmation(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "shell_exec", "match": {"command": SLEEP},
                                                           "effect": "allow"})
    setup.llm.queue(tool_calls(("shell_exec", {"command": SLEEP})), Text("The sleep was cut short."))
    answers: list[bool] = []

    def on_dialog(dialog: object) -> None:  # the first confirmation is declined, the second accepted
        assert "Kill the tool alice is running?" in dialog.message  # type: ignore[attr-defined]
        answers.append(bool(answers))
        dialog.accept() if answers[-1] else dialog.dismiss()  # type: ignore[attr-defined]

    mia = setup.open_page("member", "mia", on_dialog=on_dialog)
    say(mia, "sleep a while")
    expect(mia.locator("#status-alice")).to_have_text("running a tool", timeout=10_000)
    eventually(lambda: processes_running(SLEEP), timeout=10, what="the tool's process to start")

    stop_button(mia, "alice").click()  # declined: nothing happens
    mia.wait_for_timeout(500)
    assert answers == [False]
    expect(mia.locator("#status-alice")).to_have_text("running a tool")
    assert processes_running(SLEEP)

    stop_button(mia, "alice").click()  # accepted: the process is killed and alice hears who stopped it
    log = mia.locator("#log-main")
    # Waits well short of the sleep's 41 s: the result comes from the kill, not from the sleep ending.
    expect(log).to_contain_text("shell_exec was stopped by mia", timeout=20_000)
    expect(log).to_contain_text("The sleep was cut short.", timeout=20_000)
    assert answers == [False, True]
    assert processes_running(SLEEP) == []


def test_a_tool_call_is_one_step_open_while_pending_and_folded_when_done(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(tool_calls(("shell_exec", {"command": "ls -a"}), text="Looking."), Text("Two entries."))
    page = setup.open_page("member", "maria")
    say(page, "what is here?")
    log = page.locator("#log-main")
    step = log.locator("details.step")
    expect(step).to_have_count(1, timeout=10_000)
    expect(step.locator("summary")).to_have_text("alice calls ls -a · waiting for approval", use_inner_text=True,
                                                 timeout=10_000)
    expect(step).to_have_attribute("open", "")  # open while pending

    step.get_by_role("button", name="Review the request to run shell_exec").click()  # opens the queue on it
    expect(page.locator("#approval-modal")).to_be_visible()
    page.locator("#approval-title").click()
    page.keyboard.press("o")
    expect(log).to_contain_text("Two entries.", timeout=10_000)
    summary = step.locator("summary")
    expect(summary).to_contain_text("alice ran ls -a · approved by maria · exit 0 · ", use_inner_text=True)
    expect(summary).to_have_text(re.compile(r" · \d+(\.\d)? m?s$"), use_inner_text=True)
    expect(step).not_to_have_attribute("open", "")  # folded when done
    expect(step.locator("pre.terminal")).to_have_text(".\n..\n")
    # One article for the call and one for the answer: no separate approval, decision or result entries.
    expect(log.locator("article")).to_have_count(3)  # the question, the call, the answer

    step.locator("summary").click()  # a person may open it again
    expect(step.locator("pre.terminal")).to_be_visible()

    page.reload()  # the first page renders the same step
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(log.locator("article")).to_have_count(3)
    expect(step).not_to_have_attribute("open", "")
    expect(step.locator("summary")).to_contain_text("alice ran ls -a · approved by maria · exit 0 · ",
                                                    use_inner_text=True)
    expect(step.locator("p.decision")).to_have_text("approved maria approved shell_exec once.")


def test_results_are_rendered_by_kind_and_a_run_a_rule_allowed_says_so_in_its_header(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "file_write", "effect": "allow",
                                                           "match": {"path": "NOTES.md", "content": ""}})
    setup.llm.queue(tool_calls(("file_write", {"path": "NOTES.md", "content": "def f():\n    return 1\n"})),
                    tool_calls(("file_read", {"path": "NOTES.md"})),
                    tool_calls(("file_read", {"path": "missing.txt"})), Text("All done."))
    page = setup.open_page("member", "maria")
    say(page, "write, then read")
    log = page.locator("#log-main")
    expect(log).to_contain_text("All done.", timeout=15_000)
    write, read, missing = (log.locator("details.step").nth(i) for i in range(3))
    expect(write.locator("summary")).to_contain_text("alice ran NOTES.md file_write · allowed by rule",
                                                     use_inner_text=True)
    # A result's fields read as a result, not as JSON to decipher.
    expect(write.locator("dl.result-dl dt")).to_have_text(["path", "bytes"])
    expect(write.locator("dl.result-dl dd")).to_have_text(["NOTES.md", "22"])
    expect(write.locator("pre.result-json")).to_have_count(0)
    expect(read.locator("summary")).to_contain_text("alice ran NOTES.md file_read · needs no approval · done",
                                                    use_inner_text=True)
    expect(read.locator("pre.file code")).to_have_text("def f():\n    return 1\n")  # the file as a code block
    expect(missing.locator("summary")).to_contain_text("· error", use_inner_text=True)
    expect(missing.locator("p.result-error")).to_contain_text("no such file: missing.txt")
    expect(log.locator("article.item-notice")).to_have_count(0)  # the rule's run is in its step, not a notice


STREAMED = ("Here is **the plan**:\n\n```python\n" + "".join(f"step_{i} = run({i})\n" for i in range(40))
            + "```\n\nThat is *all*.")


def test_markdown_renders_while_it_streams_and_code_and_messages_can_be_copied(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text(STREAMED, chunk_size=4, delay=0.03))
    page = setup.open_page("member", "maria")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    say(page, "the plan?")
    streaming = page.locator("#log-main article.streaming")
    expect(streaming.locator("strong")).to_have_text("the plan", timeout=10_000)  # no raw ** while streaming
    # While the fence is still open the code is already a highlighted block, and no ``` is shown.
    expect(streaming.locator("pre.highlight span.n", has_text="step_3")).to_have_count(1, timeout=10_000)
    assert streaming.count() == 1 and "```" not in streaming.inner_text()
    expect(streaming).to_have_attribute("aria-busy", "true")  # screen readers wait for the whole message

    message = page.locator("#log-main article.item-agent")
    expect(message.locator("em")).to_have_text("all", timeout=15_000)
    expect(streaming).to_have_count(0)
    expect(message.locator("pre.highlight")).to_have_count(1)  # the stored message: the same block

    page.get_by_role("button", name="Copy this code block of alice").click()
    expect(page.locator("#toasts")).to_contain_text("Copied.")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.startswith("step_0 = run(0)\n") and copied.endswith("step_39 = run(39)\n")
    message.get_by_role("button", name=re.compile(r"^Copy alice's message of \d\d:\d\d:\d\d$")).click()
    expect(page.locator("#toasts .toast")).to_have_count(2)
    text = page.evaluate("navigator.clipboard.readText()")
    assert text.startswith("Here is the plan:") and text.endswith("That is all.")


def test_a_session_that_ended_says_so_and_stops_retrying(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    mia = setup.open_page("member", "mia")
    sockets: list[str] = []
    mia.on("websocket", lambda ws: sockets.append(ws.url))
    invite = setup.api("GET", f"/api/worlds/{setup.world}/invites")[0]["id"]
    setup.api("DELETE", f"/api/worlds/{setup.world}/invites/{invite}")

    expect(mia.locator("#session-ended")).to_be_visible(timeout=10_000)
    expect(mia.locator("#session-ended")).to_have_text(
        "Your session ended — open your link again (or ask for a new one).")
    expect(mia.locator("#connection")).to_have_attribute("data-state", "ended")
    expect(mia.locator("#connection")).to_have_text("session ended")
    attempts = len(sockets)
    mia.wait_for_timeout(9_000)  # longer than the longest reconnect delay (8 s)
    assert len(sockets) == attempts, f"it kept retrying: {sockets}"


def test_the_header_says_offline_then_reconnecting_then_live(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    page = setup.open_page("member", "mia")
    connection = page.locator("#connection")
    page.context.set_offline(True)
    setup.server.stop()  # the socket drops while the browser is offline
    expect(connection).to_have_attribute("data-state", "offline", timeout=10_000)
    expect(connection).to_have_text("offline")
    page.context.set_offline(False)
    expect(connection).to_have_attribute("data-state", "reconnecting", timeout=5_000)
    setup.server.start()  # a restart with a still-valid session: it reconnects by itself
    expect(connection).to_have_attribute("data-state", "live", timeout=15_000)
    expect(page.locator("#session-ended")).to_be_hidden()


def background(page: Page, selector: str = "body") -> str:
    color: str = page.eval_on_selector(selector, "el => getComputedStyle(el).backgroundColor")
    return color


def test_dark_mode_follows_the_system_and_a_toggle_that_persists(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text("Code:\n\n```python\nx = 1  # one\n```"))
    page = setup.open_page("member", "mia", color_scheme="dark")
    html = page.locator("html")
    expect(html).to_have_attribute("data-theme", "dark")  # from prefers-color-scheme
    assert background(page) == "rgb(18, 21, 28)"
    say(page, "show me")
    expect(page.locator("#log-main pre.highlight")).to_have_count(1, timeout=10_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "dark.png"))

    toggle = page.get_by_role("button", name="Dark mode")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    toggle.click()
    expect(html).to_have_attribute("data-theme", "light")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    assert background(page) == "rgb(246, 247, 249)"
    page.reload()  # the choice persists over the system's
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    expect(html).to_have_attribute("data-theme", "light")
    page.goto(f"{setup.server.url}/")  # and on the other pages
    expect(html).to_have_attribute("data-theme", "light")
    page.get_by_role("button", name="Dark mode").click()
    expect(html).to_have_attribute("data-theme", "dark")


def test_on_a_phone_the_conversation_comes_first_and_the_sidebar_is_a_drawer(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.respond_with(lambda body: tool_calls(("shell_exec", {"command": "echo hi"}))
                           if body["messages"][-1]["role"] == "user" else Text("It said hi."))
    page = setup.open_page("member", "mia", viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    log, sidebar = page.locator("#log-main"), page.locator("#sidebar")
    expect(sidebar).to_be_hidden()
    box = log.bounding_box()
    assert box is not None and box["y"] < 150 and box["width"] >= 360, box  # the conversation, full width, on top
    expect(page.locator("#say textarea")).to_be_in_viewport()
    expect(page.locator("#queue-indicator kbd")).to_be_hidden()  # no keyboard hints on a touch screen
    expect(page.get_by_role("button", name="Dark mode")).to_be_hidden()

    menu = page.get_by_role("button", name="Menu")
    menu.tap()
    expect(sidebar).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(sidebar.get_by_role("heading", name="Agents")).to_be_in_viewport()
    expect(page.get_by_role("button", name="Dark mode")).to_be_visible()  # with the drawer, not over the message box
    page.mouse.click(370, 400)  # a tap outside the drawer closes it
    expect(sidebar).to_be_hidden()

    say(page, "say hi")  # the approval queue by touch
    expect(page.locator("#queue-count")).to_have_text("1", timeout=10_000)
    page.locator("#queue-indicator").tap()
    expect(page.locator("#approval-modal")).to_be_visible()
    page.locator(".approval.current [data-choice=approve_once]").tap()
    expect(log).to_contain_text("It said hi.", timeout=10_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "mobile.png"))


def test_empty_states_say_how_to_add_an_agent_and_how_to_address_one(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world()
    setup.llm.queue(Text("Hello."))
    page = setup.open_page("owner")
    world_hint, chat_hint = page.locator(".empty-world"), page.locator(".empty-chat")
    expect(world_hint).to_be_visible()
    expect(world_hint).to_contain_text("This world has no agents yet. Add one in the world's Settings")
    expect(chat_hint).to_be_hidden()

    setup.api("POST", f"/api/worlds/{setup.world}/agents", {
        "name": "alice", "system_prompt": "You are alice.", "provider": "openai", "model": "test-model",
        "base_url": setup.llm.base_url})
    expect(world_hint).to_be_hidden(timeout=10_000)  # the agent arrived live
    expect(chat_hint).to_be_visible()
    expect(chat_hint).to_contain_text("start a paragraph with @name to address only that agent")
    say(page, "hi")
    expect(page.locator("#log-main")).to_contain_text("Hello.", timeout=10_000)
    expect(chat_hint).to_be_hidden()
    member = setup.open_page("member", "mia")  # a member is told whom to ask
    expect(member.locator(".empty-world")).to_be_hidden()


def test_no_typing_bubble_is_left_after_a_reply_fails(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.respond_with(lambda body: Malformed(after_chunks=3, text="half an answer that breaks"))
    page = setup.open_page("member", "mia")
    say(page, "go")
    log = page.locator("#log-main")
    expect(log.locator(".agent-error")).to_have_count(1, timeout=30_000)
    expect(log.locator("article.streaming")).to_have_count(0)
    expect(page.locator("#status-alice")).not_to_have_text("streaming")
    cut = log.locator("article.cut-off")  # the streamed part says it was cut off
    expect(cut).to_have_count(1)
    expect(cut).to_contain_text("cut off: no reply was stored")


def test_a_streaming_reply_keeps_the_place_it_will_have_after_a_reload(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.queue(Text(" ".join(f"w{i}" for i in range(120)) + " end.", chunk_size=4, delay=0.03),
                    Text("second reply."))  # the message sent meanwhile reaches alice too
    page = setup.open_page("member", "mia")
    say(page, "first")
    log = page.locator("#log-main")
    expect(log.locator("article.streaming")).to_have_count(1, timeout=10_000)
    setup.api("POST", f"/api/worlds/{setup.world}/messages", {"content": "@nobody meanwhile"})  # while it streams
    expect(log.locator("article").last).to_have_class(re.compile(r"\bstreaming\b"), timeout=5_000)
    expect(log).to_contain_text("end.", timeout=15_000)
    expect(log).to_contain_text("second reply.", timeout=10_000)
    # A streaming message shows its open block as plain text beside its `.md`: wait until both have ended.
    expect(log.locator("article.streaming")).to_have_count(0, timeout=10_000)

    def order() -> list[str]:
        return [t.split("\n")[0] for t in log.locator("article .md").all_inner_texts()]

    live = order()
    assert live[:2] == ["first", "@nobody meanwhile"] and live[2].startswith("w0 w1") and \
        live[3] == "second reply.", live
    page.reload()
    page.wait_for_selector("#connection[data-state=live]", timeout=10_000)
    assert order() == live


def test_a_message_shows_whom_it_went_to_and_says_when_it_reached_no_agent(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world()
    page = setup.open_page("owner")
    say(page, "is anyone there?")
    human = page.locator("#log-main article.item-human")
    expect(human.locator(".no-addressee")).to_have_text("No agent is addressed: mention one, or add an agent.",
                                                        timeout=10_000)
    for name in ("alice", "bob"):
        setup.api("POST", f"/api/worlds/{setup.world}/agents", {
            "name": name, "system_prompt": f"You are {name}.", "provider": "openai", "model": "test-model",
            "base_url": setup.llm.base_url})
    setup.llm.respond_with(lambda body: Text("here"))
    say(page, "@bob only you")
    expect(human.nth(1).locator(".to")).to_have_text("to bob", timeout=10_000)
    say(page, "everyone")
    expect(human.nth(2).locator(".to")).to_have_text("to alice, bob", timeout=10_000)
    say(page, "@bob @alice both of you")
    expect(human.nth(3).locator(".to")).to_have_text("to bob, alice", timeout=10_000)


def test_screenshots_of_the_settings_view(world_setup: WorldSetup) -> None:
    """The README's image of the owner's settings view (#31 item 10), an agent's configuration open."""
    page = populated(world_setup, viewport={"width": 1100, "height": 1400})
    page.locator(".settings-view details").evaluate_all("ds => ds.forEach(d => { d.open = false; })")
    page.get_by_label("Edit alice").click()
    expect(page.locator("#agent-config-alice form")).to_be_visible()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "settings.png"), full_page=True)
