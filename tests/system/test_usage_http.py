"""Usage over HTTP (#14 item 17), against a real server: GET /api/worlds/{world} and /metrics carry the
tokens summed from the replies in the log."""
from __future__ import annotations

import httpx2 as httpx

from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, make_world, wait_until
from tests.fixtures.server import ServerProcess


def test_the_world_and_metrics_show_the_tokens_of_the_replies(server: ServerProcess, owner: httpx.Client,
                                                              llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.respond_with(lambda body: Text("counted"))
    owner.post(f"/api/worlds/{world}/messages", json={"content": "hello?"})
    [reply] = wait_until(lambda: [e for e in all_events(owner, world) if e.get("sender") == "alice"],
                         what="alice's reply")
    usage = reply["usage"]
    summed = wait_until(lambda: (u := owner.get(f"/api/worlds/{world}").json()["usage"])["world"]["replies"] and u,
                        what="the reply counted")
    assert summed["agents"]["alice"] == {**{k: usage[k] for k in ("prompt_tokens", "completion_tokens",
                                                                  "total_tokens")}, "replies": 1}
    scrape = owner.get("/metrics").text
    for kind in ("prompt", "completion", "total"):
        assert f'agent_world_tokens{{agent="alice",kind="{kind}",world="{world}"}} {usage[kind + "_tokens"]}.0' \
            in scrape, scrape
