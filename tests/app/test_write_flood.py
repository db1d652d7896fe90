"""Invitees' HTTP writes in a world draw from the bucket their WebSocket frames there use (server/api/flood.py):
20 a second beyond a burst of 60, then 429 `too_many_requests` with Retry-After. Before, HTTP writes had no
limit at all (300 messages in 1.2 s, each waking every agent)."""
from __future__ import annotations

from server.api.flood import BURST
from tests.fixtures.inprocess import Site


def test_a_member_posting_300_messages_in_a_burst_is_refused_past_the_limit(site: Site) -> None:
    answers = [site.api("member", "POST", f"/api/worlds/{site.world}/messages", json={"content": f"flood {n}"})
               for n in range(300)]
    statuses = [a.status_code for a in answers]
    assert statuses[:int(BURST)] == [201] * int(BURST), statuses
    refused = [a for a in answers if a.status_code == 429]
    assert refused, statuses
    assert set(statuses) == {201, 429}, statuses
    for answer in refused:
        assert answer.json()["error"]["code"] == "too_many_requests", answer.text
        assert int(answer.headers["Retry-After"]) >= 1
    stored = {e["content"] for e in site.events() if e["kind"] == "message" and e["content"].startswith("flood ")}
    assert stored == {f"flood {n}" for n, a in enumerate(answers) if a.status_code == 201}


def test_a_flooding_member_may_still_read(site: Site) -> None:
    """Reads are not writes: the member refused above still reads the world."""
    assert site.api("member", "GET", f"/api/worlds/{site.world}/events", params={"after": 0}).status_code == 200


def test_the_owners_http_writes_are_not_limited(site: Site) -> None:
    """The owner token loads worlds (scripts, imports, tests): its HTTP writes draw from no bucket."""
    statuses = {site.api("owner", "POST", f"/api/worlds/{site.world}/messages", json={"content": f"load {n}"})
                .status_code for n in range(100)}
    assert statuses == {201}
