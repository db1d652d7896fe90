"""Find and take away (issue #31 item 8) in process: search over the API, a chat exported as Markdown,
both redacted as every event leaving the server."""
from __future__ import annotations

from tests.fixtures.inprocess import Site, site

__all__ = ["site"]
SECRET = "sk-proj-abcdefghijklmnopqrstuvwxyz123456"


def _say(site: Site, content: str) -> None:
    sent = site.api("owner", "POST", f"/api/worlds/{site.world}/messages", json={"content": content})
    assert sent.status_code == 201, sent.text


def test_search_finds_messages_redacted_for_every_role(site: Site) -> None:
    _say(site, f"deploy the kiwi build with {SECRET}")
    _say(site, "unrelated chatter")
    for role in ("owner", "member", "spectator"):
        found = site.api(role, "GET", f"/api/worlds/{site.world}/search", params={"q": "KIWI build"})
        assert found.status_code == 200, found.text
        [hit] = found.json()
        assert "kiwi build" in hit["content"] and SECRET not in hit["content"], hit
    # A query that only the hidden value holds finds nothing: no one learns a secret by searching for it.
    assert site.api("member", "GET", f"/api/worlds/{site.world}/search", params={"q": SECRET[:20]}).json() == []
    assert site.api("owner", "GET", f"/api/worlds/{site.world}/search", params={"q": ""}).status_code == 400
    assert site.api("owner", "GET", f"/api/worlds/{site.world}/search",
                    params={"q": "kiwi", "chat": "nope"}).status_code == 404


def test_a_chat_exports_as_a_redacted_markdown_attachment(site: Site) -> None:
    _say(site, f"ship the mango release, token {SECRET}")
    answer = site.page("spectator", "GET", f"/api/worlds/{site.world}/chats/main/export")  # the page's button
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/markdown")
    assert answer.headers["content-disposition"].startswith("attachment;")
    assert ".md" in answer.headers["content-disposition"]
    assert answer.text.startswith("# Main\n")
    assert "ship the mango release" in answer.text and SECRET not in answer.text
    assert site.page(None, "GET", f"/api/worlds/{site.world}/chats/main/export").status_code == 401


def test_a_match_only_in_a_hidden_value_does_not_use_up_the_limit(site: Site) -> None:
    # An older public message holds the probe; a newer one holds it only inside a secret. With limit=1, the
    # public one must come back: an empty answer would tell a spectator that the secret holds the probe.
    probe = "qrstuvwxyz12"
    _say(site, f"older public note about {probe}")
    _say(site, f"newer: the token is sk-proj-abcdefghijklmnop{probe}3456")
    found = site.api("spectator", "GET", f"/api/worlds/{site.world}/search", params={"q": probe, "limit": 1})
    assert found.status_code == 200, found.text
    assert [hit["content"] for hit in found.json()] == [f"older public note about {probe}"]


def test_searches_beyond_a_persons_rate_are_refused_with_retry_after(site: Site) -> None:
    invited = site.api("owner", "POST", f"/api/worlds/{site.world}/invites", json={"role": "spectator",
                                                                                    "name": "prober"})
    assert invited.status_code == 201, invited.text
    prober = {"Authorization": f"Bearer {invited.json()['token']}"}
    answers = [site.client.get(f"/api/worlds/{site.world}/search", params={"q": "anything"}, headers=prober)
               for _ in range(30)]
    refused = [a for a in answers if a.status_code == 429]
    assert refused and int(refused[0].headers["Retry-After"]) >= 1, [a.status_code for a in answers]
    assert refused[0].json()["error"]["code"] == "too_many_requests"
    export = site.client.get(f"/api/worlds/{site.world}/chats/main/export", headers=prober)
    assert export.status_code == 429  # exports draw from the same bucket
    # Other people's searches are theirs: the spectator's bucket is untouched, the owner has none.
    assert site.api("spectator", "GET", f"/api/worlds/{site.world}/search", params={"q": "x"}).status_code == 200
    assert site.api("owner", "GET", f"/api/worlds/{site.world}/search", params={"q": "x"}).status_code == 200
