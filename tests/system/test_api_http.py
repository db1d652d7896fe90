"""The JSON HTTP API (docs/protocol.md §5) of a real `agent-world serve` process."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx

from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, error_of, make_world, wait_until
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.server import ServerProcess

DECIDE = {"role": "tool", "content": json.dumps({"decision": "approve", "scope": "once"})}


def _message(events: list[dict[str, Any]], **fields: Any) -> dict[str, Any] | None:
    """The first message event whose fields have these values."""
    for event in events:
        if event.get("kind") == "message" and all(event.get(k) == v for k, v in fields.items()):
            return event
    return None


def _pending(owner: httpx.Client, world: str) -> list[dict[str, Any]]:
    response = owner.get(f"/api/worlds/{world}/approvals/pending")
    assert response.status_code == 200, response.text
    pending: list[dict[str, Any]] = response.json()
    return pending


def _ask_for_shell(owner: httpx.Client, llm: OpenAIDouble, world: str, command: str) -> dict[str, Any]:
    """Make alice call shell_exec(command); returns the pending approval."""
    llm.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": command}))))
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": "please run it"}).status_code == 201
    return wait_until(lambda: _pending(owner, world), what="a pending approval")[0]


def test_agent_reply_appears_in_events_in_seq_order(owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.respond_with(lambda body: Text("hello from alice"))
    sent = owner.post(f"/api/worlds/{world}/messages", json={"content": "hi alice"})
    assert sent.status_code == 201, sent.text
    assert sent.json()["sender"] == "human:owner" and sent.json()["role"] == "user"

    reply = wait_until(lambda: _message(all_events(owner, world), role="assistant", content="hello from alice"),
                       what="alice's reply")
    events = all_events(owner, world)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert sent.json()["seq"] < reply["seq"] and reply["agent"] == "alice" and reply["sender"] == "alice"


def test_approved_tool_call_runs_once_and_later_decisions_are_refused(
        owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    approval = _ask_for_shell(owner, llm_double, world, "echo ran-$((40+2))")
    assert approval["agent"] == "alice" and approval["request"]["toolName"] == "shell_exec"
    call_id = approval["request"]["toolCallId"]

    decided = owner.post(f"/api/worlds/{world}/tool-results", json={**DECIDE, "tool_call_id": approval["id"]})
    assert decided.status_code == 201, decided.text
    result = wait_until(lambda: _message(all_events(owner, world), role="tool", tool_call_id=call_id),
                        what="the tool's result")
    assert "ran-42" in result["content"]
    assert _pending(owner, world) == []

    again = owner.post(f"/api/worlds/{world}/tool-results", json={**DECIDE, "tool_call_id": approval["id"]})
    assert again.status_code == 409 and error_of(again) == "already_decided"
    unknown = owner.post(f"/api/worlds/{world}/tool-results", json={**DECIDE, "tool_call_id": "approval_nope"})
    assert unknown.status_code == 404 and error_of(unknown) == "unknown_tool_call"
    results = [e for e in all_events(owner, world) if e.get("tool_call_id") == call_id]
    assert len(results) == 1


def test_events_page_by_after_and_limit(owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    for n in range(5):
        assert owner.post(f"/api/worlds/{world}/messages", json={"content": f"note {n}"}).status_code == 201
    everything = all_events(owner, world)
    assert len(everything) == 7  # world_created, chat_created, five messages

    first = owner.get(f"/api/worlds/{world}/events", params={"after": 0, "limit": 3}).json()
    second = owner.get(f"/api/worlds/{world}/events", params={"after": 3, "limit": 3}).json()
    assert [e["seq"] for e in first] == [1, 2, 3] and [e["seq"] for e in second] == [4, 5, 6]
    assert owner.get(f"/api/worlds/{world}/events", params={"after": 7}).json() == []
    assert len(owner.get(f"/api/worlds/{world}/events", params={"limit": 10**9}).json()) == 7  # capped, not refused
    for bad in ({"after": "x"}, {"after": -1}, {"limit": 0}, {"limit": "1.5"}, {"after": "1 "}):
        response = owner.get(f"/api/worlds/{world}/events", params=bad)
        assert response.status_code == 400 and error_of(response) == "invalid", bad


def test_errors_have_the_json_shape_and_a_fitting_status(owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    cases: list[tuple[httpx.Response, int, str]] = [
        (owner.get("/api/worlds/no-such-world"), 404, "not_found"),
        (owner.get("/api/worlds/no-such-world/events"), 404, "not_found"),
        (owner.delete(f"/api/worlds/{world}/agents/nobody"), 404, "not_found"),
        (owner.post(f"/api/worlds/{world}/messages", json={"content": "x", "chat": "no-chat"}), 404, "not_found"),
        (owner.post(f"/api/worlds/{world}/messages", content=b'{"content": ',
                    headers={"content-type": "application/json"}), 400, "invalid"),
        (owner.post(f"/api/worlds/{world}/messages", json=["a list"]), 400, "invalid"),
        (owner.post(f"/api/worlds/{world}/messages", json={"content": "x", "extra": 1}), 400, "invalid"),
        (owner.post(f"/api/worlds/{world}/messages", json={}), 400, "invalid"),
        (owner.post(f"/api/worlds/{world}/messages", json={"content": 42}), 400, "invalid"),
        (owner.post(f"/api/worlds/{world}/messages", content=b"content=hi",
                    headers={"content-type": "application/x-www-form-urlencoded"}), 415, "unsupported_media_type"),
        (owner.post(f"/api/worlds/{world}/agents", json={"name": "bad name!"}), 400, "invalid"),
        (owner.post(f"/api/worlds/{world}/agents", json={"name": "alice"}), 409, "conflict"),
        (owner.post(f"/api/worlds/{world}/tool-results", json={"role": "tool", "tool_call_id": "x"}), 400, "invalid"),
    ]
    for response, status, code in cases:
        assert (response.status_code, error_of(response)) == (status, code), (response.request.url, response.text)


def test_oversized_bodies_are_refused_with_413_and_change_nothing(
        owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    before = all_events(owner, world)
    big = json.dumps({"content": "x" * (1 << 20)}).encode()
    declared = owner.post(f"/api/worlds/{world}/messages", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and error_of(declared) == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server must count while reading
        for start in range(0, len(big), 64 * 1024):
            yield big[start:start + 64 * 1024]
    streamed = owner.post(f"/api/worlds/{world}/messages", content=chunks(),
                          headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and error_of(streamed) == "too_large"
    assert all_events(owner, world) == before


def test_audit_lists_request_and_decision_with_secrets_redacted(owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    approval = _ask_for_shell(owner, llm_double, world, "echo audited")
    decision = {"decision": "approve", "scope": "always",
                "match": {"command": "echo audit*", "api_token": "hunter2-decision-secret"}}
    decided = owner.post(f"/api/worlds/{world}/tool-results",
                         json={"role": "tool", "tool_call_id": approval["id"], "content": json.dumps(decision)})
    assert decided.status_code == 201, decided.text
    rule = owner.post(f"/api/worlds/{world}/rules",
                      json={"tool": "file_write", "effect": "deny", "match": {"password": "hunter2-rule-secret"}})
    assert rule.status_code == 201, rule.text

    audit = owner.get(f"/api/worlds/{world}/audit")
    assert audit.status_code == 200
    by_action = {entry["action"]: entry for entry in audit.json()}
    requested, decided_entry = by_action["approval_requested"], by_action["decided"]
    assert requested["approval_id"] == approval["id"] and requested["tool"] == "shell_exec"
    assert requested["arguments"] == {"command": "echo audited"} and requested["agent"] == "alice"
    assert decided_entry["who"] == "human:owner" and decided_entry["decision"] == "approve"
    assert decided_entry["scope"] == "always" and decided_entry["seq"] > requested["seq"]
    assert "rule_added" in by_action
    assert "hunter2" not in audit.text
    assert "hunter2" not in json.dumps(all_events(owner, world))  # the raw event stream hides them too


def test_events_hide_secret_looking_tool_arguments_that_the_llm_wrote(owner: httpx.Client,
                                                                      llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.respond_with(reply_by_turn(tool_calls(("file_read", {"path": "notes.md", "api_key": "sk-live-7f3a"})),
                                          after_tools=Text("done")))
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": "read it"}).status_code == 201
    wait_until(lambda: _message(all_events(owner, world), content="done"), what="alice's answer")
    events = all_events(owner, world)
    call = _message(events, sender="alice", role="assistant")
    assert call is not None
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"path": "notes.md", "api_key": "[redacted]"}
    assert "sk-live-7f3a" not in json.dumps(events)
    # the log keeps what the model wrote: its next request shows its own call as it was
    sent = [m for m in llm_double.requests[-1].body["messages"] if m.get("tool_calls")]
    assert "sk-live-7f3a" in sent[0]["tool_calls"][0]["function"]["arguments"]


def test_unknown_api_paths_answer_in_the_json_error_shape(server: ServerProcess) -> None:
    import httpx2

    missing = httpx2.get(f"{server.url}/api/nowhere", headers=server.headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = httpx2.put(f"{server.url}/api/worlds", headers=server.headers)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
