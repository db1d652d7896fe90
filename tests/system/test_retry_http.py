"""Retry over HTTP (#14 item 7), against a real server: a member retries a failed reply; a spectator is
refused by the server (403, counted in /metrics, nothing logged)."""
from __future__ import annotations

import httpx2 as httpx

from server.testing.openai_double import OpenAIDouble, Status, Text
from tests.fixtures.api import all_events, error_of, invite, make_world, wait_until
from tests.fixtures.server import ServerProcess


def _refusals(owner: httpx.Client) -> float:
    line = 'agent_world_refusals_total{code="forbidden",role="spectator"} '
    found = [row for row in owner.get("/metrics").text.splitlines() if row.startswith(line)]
    return float(found[0].removeprefix(line)) if found else 0.0


def test_a_member_retries_a_failed_reply_and_a_spectator_is_refused(server: ServerProcess, owner: httpx.Client,
                                                                     llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(Status(401, "Incorrect API key provided"), Text("now it works"))
    owner.post(f"/api/worlds/{world}/messages", json={"content": "hello?"})
    [error] = wait_until(lambda: [e for e in all_events(owner, world) if e["kind"] == "agent_error"],
                         what="an agent_error")
    url = f"/api/worlds/{world}/agents/alice/retry"
    spectator, member = invite(owner, world, "spectator", "sam"), invite(owner, world, "member", "max")
    before, counted = len(all_events(owner, world)), _refusals(owner)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {spectator['token']}"}) as sam:
        refused = sam.post(url, json={"seq": error["seq"]})
    assert refused.status_code == 403 and error_of(refused) == "forbidden", refused.text
    assert _refusals(owner) == counted + 1
    assert len(all_events(owner, world)) == before and len(llm_double.requests) == 1
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {member['token']}"}) as max_:
        assert error_of(max_.post(url, json={"seq": "x"})) == "invalid"
        retried = max_.post(url, json={"seq": error["seq"]})
        assert retried.status_code == 201, retried.text
        assert retried.json()["kind"] == "turn_retried" and retried.json()["sender"] == "human:max"
        wait_until(lambda: any(e.get("content") == "now it works" for e in all_events(owner, world)),
                   what="the retried answer")
        again = max_.post(url, json={"seq": error["seq"]})
        assert again.status_code == 409 and error_of(again) == "conflict", again.text
    assert llm_double.requests[1].body["messages"] == llm_double.requests[0].body["messages"]
