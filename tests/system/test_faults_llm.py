"""Issue #11 faults 3 and 4: an LLM that misbehaves never leaves an agent stuck, against a real server.

The real `openai` SDK inside `agent-world serve` talks to the double, which misbehaves on command.
"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx2 as httpx
from websockets.sync.client import ClientConnection, connect

from server.testing.openai_double import Malformed, OpenAIDouble, Stall, Text
from tests.fixtures.api import all_events, error_of, invite, make_world, wait_until
from tests.fixtures.server import ServerProcess


def _errors(owner: httpx.Client, world: str) -> list[dict[str, Any]]:
    return [e for e in all_events(owner, world) if e["kind"] == "agent_error"]


def _state(owner: httpx.Client, world: str, agent: str = "alice") -> dict[str, Any]:
    status: dict[str, Any] = owner.get(f"/api/worlds/{world}").json()["status"][agent]
    return status


def _read_streamed(ws: ClientConnection, text: str, timeout: float = 20.0) -> None:
    """Read the socket's frames until the chunks streamed so far start with `text`."""
    streamed, deadline = "", time.monotonic() + timeout
    while not streamed.startswith(text):
        frame = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if frame["type"] == "chunk":
            streamed = streamed[:frame["at"]] + frame["delta"]


def _set(owner: httpx.Client, world: str, **settings: Any) -> None:
    changed = owner.patch(f"/api/worlds/{world}", json={"settings": settings})
    assert changed.status_code == 200, changed.text


def test_a_malformed_sse_line_ends_the_turn_with_an_agent_error(server: ServerProcess, owner: httpx.Client,
                                                                 llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(Malformed("{not json"))
    owner.post(f"/api/worlds/{world}/messages", json={"content": "hello?"})
    [error] = wait_until(lambda: _errors(owner, world), timeout=10, what="an agent_error")
    assert "alice could not answer" in error["message"] and "cannot read" in error["message"], error
    assert len(llm_double.requests) == 1  # a stream we cannot read is not retried
    state = _state(owner, world)
    assert state["state"] == "error" and "cannot read" in state["last_error"], state
    owner.post(f"/api/worlds/{world}/messages", json={"content": "and now?"})  # the agent is not stuck
    wait_until(lambda: any(e.get("content") == "ok" for e in all_events(owner, world)), what="the next answer")


def test_a_stream_kept_alive_by_comments_fails_at_the_overall_deadline(server: ServerProcess, owner: httpx.Client,
                                                                        llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    _set(owner, world, llm_timeout=2, llm_first_token_timeout=1)
    llm_double.queue(Stall(after_chunks=2, every=0.2))  # two chunks, then comments forever
    owner.post(f"/api/worlds/{world}/messages", json={"content": "hello?"})
    [error] = wait_until(lambda: _errors(owner, world), timeout=30, what="an agent_error")
    # The overall deadline ended it, not the first-token one (the two chunks came in time).
    assert "longer than 2 s (llm_timeout)" in error["message"], error
    assert "llm_first_token_timeout" not in error["message"], error
    assert _state(owner, world)["state"] == "error"


def test_a_slow_first_token_fails_at_the_first_token_deadline(server: ServerProcess, owner: httpx.Client,
                                                               llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    _set(owner, world, llm_first_token_timeout=1)
    llm_double.queue(Stall(seconds=30, every=0.2))  # comments only, for longer than the deadline
    owner.post(f"/api/worlds/{world}/messages", json={"content": "hello?"})
    [error] = wait_until(lambda: _errors(owner, world), timeout=6, what="an agent_error")
    assert "no first token within 1 s (llm_first_token_timeout)" in error["message"], error
    llm_double.queue(Stall(seconds=0.3, every=0.1, then=Text("late but here")))  # within the deadline: fine
    owner.post(f"/api/worlds/{world}/messages", json={"content": "again?"})
    wait_until(lambda: any(e.get("content") == "late but here" for e in all_events(owner, world)),
               what="the late answer")


def test_a_member_stops_a_stalled_turn_and_a_spectator_cannot(server: ServerProcess, owner: httpx.Client,
                                                               llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(Stall(after_chunks=3, then=Text("partial words then nothing", chunk_size=8)))
    with connect(f"{server.ws_url}/api/worlds/{world}/ws", additional_headers=server.headers,
                 open_timeout=10) as ws:
        owner.post(f"/api/worlds/{world}/messages", json={"content": "hello?"})
        _read_streamed(ws, "partial words then")  # the first chunks are out; then the double stalls
    spectator = invite(owner, world, "spectator", "sam")
    member = invite(owner, world, "member", "max")
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {spectator['token']}"}) as sam:
        refused = sam.post(f"/api/worlds/{world}/agents/alice/stop")
    assert refused.status_code == 403 and error_of(refused) == "forbidden"
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {member['token']}"}) as max_:
        stopped = max_.post(f"/api/worlds/{world}/agents/alice/stop")
        assert stopped.status_code == 200 and stopped.json() == {"agent": "alice", "stopped": True}, stopped.text
        again = max_.post(f"/api/worlds/{world}/agents/alice/stop")
        assert again.json()["stopped"] is False
    [reply] = wait_until(lambda: [e for e in all_events(owner, world) if e.get("sender") == "alice"],
                         what="alice's stopped reply")
    assert reply["content"].startswith("partial words then") and "stopped by max" in reply["content"], reply
    assert reply["stopped"] == "stopped by max"
    assert _errors(owner, world) == []
    assert owner.get(f"/api/worlds/{world}/snapshot").status_code == 200
    wait_until(lambda: _state(owner, world)["state"] == "idle", what="alice idle")
    owner.post(f"/api/worlds/{world}/messages", json={"content": "and now?"})  # the turn ended cleanly
    wait_until(lambda: any(e.get("content") == "ok" for e in all_events(owner, world)), what="the next answer")
