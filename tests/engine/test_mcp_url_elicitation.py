"""URL-mode elicitation (issue #33): an MCP server asks a person to open a page (out-of-band consent). The
question joins the queue with the URL and its host; the page shows a link the person opens themselves,
nothing opens by itself; their answer is an action alone, which goes back to the server. A URL that could
mislead (credentials before the host, another scheme) is declined before anyone sees it."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.engine.public import public
from server.errors import AppError
from server.redact import remember_secret
from server.tools.mcp.forms import check_url
from tests.fixtures.engine import MEMBER, Harness, reply_by_turn, tool_calls
from web.render import render_event

TROUBLE = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")
# A random-looking session id in the query: the link's point, which shape-based redaction must not break.
URL = "https://pay.example.com/approve?session=Zq8rT3vWx9Yb2Nc4Md6Kf1Lh5Pj7Gs0"


async def _consent(harness: Harness, url: str) -> None:
    await harness.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                    "tools": {"consent": {"approval": "never"}}}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__consent", {"url": url}))))
    await harness.say("pay for it")


async def _result(harness: Harness) -> str:
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__consent",
                                      timeout=15)
    return str(result["content"])


async def _answer(harness: Harness, question: dict[str, Any], answer: object) -> Any:
    return await harness.engine.submit_tool_result(harness.world, MEMBER, {
        "role": "tool", "tool_call_id": question["tool_calls"][0]["id"], "content": json.dumps(answer)})


async def test_a_url_question_shows_the_link_and_its_host_and_the_answer_returns(harness: Harness) -> None:
    await _consent(harness, URL)
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    asked = question["elicitation"]
    assert asked["mode"] == "url" and asked["url"] == URL and asked["host"] == "pay.example.com"
    assert asked["elicitationId"] == "payment-1" and "requestedSchema" not in asked
    assert [e["id"] for e in await harness.engine.elicitations.pending(harness.world)] == [question["id"]]

    page = render_event(question, vocab.MEMBER, frozenset()).in_view
    link = f'<a class="elicit-link" href="{URL}" target="_blank" rel="noopener noreferrer">'
    assert link in page and '<b class="elicit-host">pay.example.com</b>' in page
    assert 'data-mode="url"' in page and ">Done</button>" in page and "<input" not in page
    assert "window.open" not in page and "<script" not in page and "http-equiv" not in page  # nothing opens
    spectator = render_event(question, vocab.SPECTATOR, frozenset()).in_view
    assert link in spectator and "<form" not in spectator

    with pytest.raises(AppError, match="URL question") as refused:  # no content goes back in URL mode
        await _answer(harness, question, {"action": "accept", "content": {"paid": True}})
    assert refused.value.code == vocab.INVALID
    await _answer(harness, question, {"action": "accept"})
    assert await _result(harness) == "consent: accept"
    await harness.idle(timeout=10)
    assert await harness.engine.elicitations.pending(harness.world) == []


async def test_a_declined_url_question_tells_the_server(harness: Harness) -> None:
    await _consent(harness, URL)
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    await _answer(harness, question, {"action": "decline"})
    assert await _result(harness) == "consent: decline"


async def _pay_first(harness: Harness, times: int, url: str = URL, key: str = "", **settings: Any) -> None:
    await harness.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                    "tools": {"pay_first": {"approval": "never"}}}], **settings)
    arguments = {"url": url, "times": times, "key": key}
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__pay_first", arguments))))
    await harness.say("pay for it")


async def _paid(harness: Harness) -> str:
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__pay_first",
                                      timeout=15)
    return str(result["content"])


async def test_a_call_refused_until_a_link_is_opened_asks_for_it_and_goes_on_once_done(harness: Harness) -> None:
    # The server's -32042 (URL elicitation required): a URL question like its own, then the call once more.
    await _pay_first(harness, times=1)
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    asked = question["elicitation"]
    assert asked["mode"] == "url" and asked["url"] == URL and asked["elicitationId"] == "pay-0"
    assert asked["host"] == "pay.example.com"
    await _answer(harness, question, {"action": "accept"})
    assert await _paid(harness) == "paid"


async def test_the_call_made_again_has_a_deadline_of_its_own(harness: Harness) -> None:
    # No call is open while the person opens the link: the first ended with its refusal. The person takes
    # longer than a call may (mcp_timeout); the call made again is not cut short by the first one's deadline.
    await _pay_first(harness, times=1, mcp_timeout=1)
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    await asyncio.sleep(1.5)
    await _answer(harness, question, {"action": "accept"})
    assert await _paid(harness) == "paid"


async def test_a_question_asked_while_links_wait_belongs_to_the_call_that_asked_it(harness: Harness) -> None:
    # Two calls on one server: alice's waits for its link (no request of it open at the server), then bob's
    # asks a form question mid-call. Stdio tells no more than "a call in flight asked": bob's.
    await harness.make_world("alice", "bob", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                           "tools": {"pay_first": {"approval": "never"},
                                                                     "ask_many": {"approval": "never"}}}])

    def respond(body: dict[str, Any]) -> Any:
        asked = str(body["messages"][-1].get("content") or "")
        return tool_calls(("t__pay_first", {"url": URL}) if "pay" in asked else ("t__ask_many", {"count": 1}))
    harness.double.respond_with(respond)
    await harness.say("@alice pay")
    [link] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    await harness.say("@bob ask")
    form = (await harness.wait_for(lambda e: bool(e.get("elicitation")), count=2, timeout=15))[1]
    assert json.loads(link["tool_calls"][0]["function"]["arguments"])["toolName"] == "t__pay_first"
    assert form["agent"] == "bob" and "mode" not in form["elicitation"]
    assert json.loads(form["tool_calls"][0]["function"]["arguments"])["toolName"] == "t__ask_many"


async def test_a_link_not_opened_ends_the_call_saying_so(harness: Harness) -> None:
    await _pay_first(harness, times=2)
    [first] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    await _answer(harness, first, {"action": "accept"})  # the links are asked one after another
    second = (await harness.wait_for(lambda e: bool(e.get("elicitation")), count=2, timeout=15))[1]
    assert second["elicitation"]["elicitationId"] == "pay-1"
    await _answer(harness, second, {"action": "decline"})
    result = await _paid(harness)
    assert "needs a person to open a link first" in result and "Approve payment 1" in result and "decline" in result


async def test_a_secret_in_a_link_s_message_is_hidden_in_the_call_s_result(harness: Harness) -> None:
    key = "4b7e1c9a2f6d0e8b3a5c"
    secret = f"sk-live-{key}"  # a key the server knows (only its end is in the model's arguments)
    remember_secret(secret)
    await _pay_first(harness, times=1, key=key)
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    await _answer(harness, question, {"action": "decline"})
    result = await _paid(harness)
    assert "Pay with key [redacted]" in result
    await harness.idle(timeout=10)  # the agent's next request carries the result: the provider never reads it
    assert len(harness.double.requests) >= 2
    assert secret not in json.dumps([request.body for request in harness.double.requests])
    stored = [e for e in await harness.engine.store.log.read(harness.world, 0, 100_000) if e.get("role") == "tool"]
    assert stored and secret not in json.dumps(stored)  # (the question's own event is hidden on its way out)


async def test_a_link_that_cannot_be_shown_is_not_asked_and_the_result_says_why(harness: Harness) -> None:
    await _pay_first(harness, times=1, url="javascript:alert(1)")
    result = await _paid(harness)
    assert "it was not asked:" in result and "the answer was" not in result
    assert not [e for e in await harness.events() if e.get("elicitation")]


async def test_a_refusal_that_wants_too_many_links_opened_asks_for_none(harness: Harness) -> None:
    await _pay_first(harness, times=6)
    assert "asked for 6 links to be opened before it goes on (at most 5)" in await _paid(harness)
    assert not [e for e in await harness.events() if e.get("elicitation")]


@pytest.mark.parametrize("url", ["https://pay.example.com@evil.example/approve", "javascript:alert(1)",
                                 "file:///etc/passwd", "https://pay.example.com/a b"])
async def test_a_misleading_url_is_declined_before_anyone_sees_it(harness: Harness, url: str) -> None:
    await _consent(harness, url)
    assert await _result(harness) == "consent: decline"
    assert not [e for e in await harness.events() if e.get("elicitation")]


def test_the_host_shown_is_its_ascii_form() -> None:
    """A look-alike letter (a Cyrillic a, U+0430) cannot pass for a Latin one: the host is shown as IDNA."""
    assert check_url("https://p\u0430ypal.example/login") == ("https://p\u0430ypal.example/login",
                                                             "xn--pypal-4ve.example")
    assert check_url("http://127.0.0.1:8443/x")[1] == "127.0.0.1:8443"


def test_the_host_shown_is_the_one_a_browser_opens() -> None:
    """UTS #46 non-transitional, as browsers: faß.de is xn--fa-hia.de (IDNA 2003 said fass.de, another host)."""
    assert check_url("https://faß.de/pay")[1] == "xn--fa-hia.de"
    assert check_url("https://[::1]:8443/x")[1] == "[::1]:8443"


@pytest.mark.parametrize("url", [
    "https://evil.example\\accounts.google.com/",  # a browser reads the backslash as "/": it opens evil.example
    "https://evil_host.example/",
    "https://accounts.google.com@evil.example/",
    "https://pay.example/\u202egnp.exe",  # right-to-left override: what is shown is not what is read
    "https://pay\u200d.example/",  # zero-width joiner
])
def test_a_url_whose_host_could_mislead_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        check_url(url)


def test_a_known_secret_in_the_link_is_still_hidden() -> None:
    secret = "sk-live-" + "9f3a7c1e5b2d8f4a6c0e"
    remember_secret(secret)
    question = {"kind": "message", "role": "assistant", "sender": "server",
                "elicitation": {"mode": "url", "url": f"https://pay.example.com/a?key={secret}&session=Zq8rT3vWx9Yb2Nc4",
                                "host": "pay.example.com", "message": "pay"}}
    shown = public(question)["elicitation"]
    assert shown["url"] == "https://pay.example.com/a?key=[redacted]&session=Zq8rT3vWx9Yb2Nc4"
