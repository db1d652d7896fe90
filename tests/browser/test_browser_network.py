"""The `ask` network mode in the page (issue #33): a running command's connection is decided in the
queue, read as where it goes; and the package-registry rules an owner may start from. Chromium against
a real `agent-world serve`. No host here resolves: a denial is asked before any lookup, and an approved
connection then fails to resolve, which the command is told."""
from __future__ import annotations

import json
import re
import shlex
from typing import Any

from playwright.sync_api import Page, expect

from server.testing.openai_double import Text
from server.tools.egress.hosts import PACKAGE_REGISTRIES
from tests.fixtures.api import wait_until
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import tool_calls

# The second host is "\u0440ypi.invalid" (a Cyrillic first letter): the proxy takes ASCII names only.
FETCH = ("import urllib.request\n"
         "for url in ['https://api.example.com/', 'http://xn--ypi-zed.invalid/', 'https://[2001:db8::1]/']:\n"
         "    try: urllib.request.urlopen(url, timeout=60); print('GOT', url)\n"
         "    except Exception as exc: print('FAILED', url, exc)\n")


def fetch_then_report(body: dict[str, Any]) -> Any:
    """alice runs FETCH in the shell, then says what it printed."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Text("said: " + str(json.loads(last["content"]).get("output")))
    return tool_calls(("shell_exec", {"command": f"python3 -c {shlex.quote(FETCH)}", "timeout": 120}))


def test_a_connection_is_decided_in_the_queue_as_where_it_goes(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.llm.respond_with(fetch_then_report)
    world = setup.make_world("alice", sandbox_network="ask")
    ops = setup.make_chat("Ops")
    page = setup.open_page()
    setup.say("fetch the two pages", chat=ops)
    shell = wait_until(lambda: setup.pending() or None, what="the shell call's request")[0]
    setup.api("POST", f"/api/worlds/{world}/tool-results", {
        "role": "tool", "tool_call_id": shell["id"], "content": json.dumps({"decision": "approve", "scope": "once"})})

    expect(page.locator("#queue-count")).to_have_text("1", timeout=30_000)
    page.locator("#queue-indicator").click()
    current = page.locator(".approval.current")
    head = current.locator(".approval-head")
    # Read as a connection, not as a call of a tool named `network` with JSON.
    expect(head).to_have_text(re.compile(r"alice's\s+shell_exec wants to reach api\.example\.com:443\s+in chat Ops"))
    expect(current.locator(".approval-message")).to_have_text(
        "alice's `shell_exec` (in chat Ops) wants to reach api.example.com:443")
    expect(current.locator(".network-note")).not_to_contain_text("internationalized")
    expect(current.locator("details.edit")).to_have_count(0)  # approved or denied as asked, never edited
    current.locator("[data-choice=approve_always]").click()  # a rule for this host:port, said so
    expect(page.locator("#confirm-text")).to_have_text(
        "Allow connections to `api.example.com:443` by every agent in this world, until revoked?")
    page.locator("#confirm-no").click()
    current.locator("input[name=reason]").fill("not that API")
    current.locator("[data-choice=deny]").click()

    # The next connection: a look-alike name arrives as its punycode, said to be one.
    expect(page.locator('.approval[data-host="xn--ypi-zed.invalid:80"]')).to_have_count(1, timeout=30_000)
    _queue_on_its_only_request(page)
    expect(head).to_contain_text("wants to reach xn--ypi-zed.invalid:80")
    expect(current.locator(".network-note")).to_contain_text("An internationalized name")
    current.locator("[data-choice=approve_session]").click()
    expect(page.locator("#confirm-text")).to_have_text(
        "Allow alice's connections to xn--ypi-zed.invalid:80 in chat Ops, until the chat ends?")
    page.locator("#confirm-no").click()
    current.locator("[data-choice=approve_once]").click()

    # An IPv6 host: its rule's pattern is the host escaped as a glob, and said to be that host only.
    expect(page.locator('.approval[data-host="[2001:db8::1]:443"]')).to_have_count(1, timeout=30_000)
    _queue_on_its_only_request(page)
    expect(current.locator("input[name=match][data-arg=host]")).to_have_value("[[]2001:db8::1]:443")
    current.locator("[data-choice=approve_always]").click()
    expect(page.locator("#confirm-text")).to_have_text(
        "Allow connections to `[2001:db8::1]:443` by every agent in this world, until revoked?")
    page.locator("#confirm-no").click()
    current.locator("[data-choice=deny]").click()

    said = page.locator(".log .item").filter(has_text="said: ")
    expect(said).to_contain_text("FAILED https://api.example.com/", timeout=60_000)
    expect(said).to_contain_text("403 denied by owner: not that API")
    expect(said).to_contain_text("xn--ypi-zed.invalid does not resolve")  # let through, then nowhere to go
    audit = setup.api("GET", f"/api/worlds/{world}/audit")
    connections = {(e["host"], e["allowed"]) for e in audit if e["action"] == "network_connection"}
    assert connections == {("api.example.com", False), ("xn--ypi-zed.invalid", False), ("2001:db8::1", False)}, audit
    decided = [(e["decision"], e["reason"]) for e in audit if e["action"] == "decided" and e["tool"] == "network"]
    assert sorted(decided, key=str) == [("approve", None), ("deny", "not that API"), ("deny", None)], decided


def test_the_owner_adds_the_package_registries_and_removes_one(world_setup: WorldSetup) -> None:
    setup = world_setup
    world = setup.make_world("alice", sandbox_network="ask")
    page = setup.open_settings()
    rules = page.locator("#rules .rule")
    expect(rules).to_have_count(0)  # never on by itself
    page.locator("#network-defaults summary").click()
    expect(page.locator("#network-defaults")).to_contain_text("pypi.org:443")
    page.locator("#network-defaults button[type=submit]").click()
    expect(rules).to_have_count(len(PACKAGE_REGISTRIES), timeout=10_000)
    pypi = rules.filter(has_text="pypi.org:443").first
    pypi.get_by_role("button", name="Revoke").click()
    expect(rules).to_have_count(len(PACKAGE_REGISTRIES) - 1, timeout=10_000)
    left = {r["match"]["host"] for r in setup.api("GET", f"/api/worlds/{world}/rules")}
    assert left == set(PACKAGE_REGISTRIES) - {"pypi.org:443"}


def _queue_on_its_only_request(page: Page) -> None:
    """The queue open on its one request. The decided request leaves and the next arrives in either order,
    and the dialog closes when the queue empties: wait until only the next is left, then open it if closed
    (a click on the badge behind an open dialog would close it)."""
    expect(page.locator(".approval[data-host]")).to_have_count(1, timeout=30_000)
    if not page.locator("#approval-modal").is_visible():
        page.locator("#queue-indicator").click()
    expect(page.locator("#approval-modal")).to_be_visible()
