"""The owner's management routes of the page (issue #14 items 8-11) over plain HTTP: owner-only on the server."""
from __future__ import annotations

from pathlib import Path

import httpx2 as httpx

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, invite, make_world, sign_in
from tests.fixtures.server import ServerProcess, start_server


def _member(server: ServerProcess, owner: httpx.Client, world: str) -> httpx.Client:
    browser = client_for(server)
    browser.headers["Origin"] = server.url
    sign_in(browser, invite(owner, world, "member", "mia")["url"])
    return browser


def test_members_are_refused_every_owner_action_and_may_start_chats(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    chat = owner.post(f"/api/worlds/{world}/chats", json={"title": "Ops"}).json()["id"]
    mia = _member(server, owner, world)
    try:
        for path, data in [("settings", {"name": "x", "turn_limit": "3", "context_messages": "20"}),
                           ("mcp", {"name": "m", "command": "true"}), ("agents", {"name": "eve"}),
                           ("agents/alice/remove", {}), ("agents/alice/test", {}),
                           (f"chats/{chat}/rename", {"title": "Mine"}), (f"chats/{chat}/delete", {}),
                           ("invites/inv_x/revoke", {})]:
            answer = mia.post(f"/w/{world}/{path}", data=data, headers={"HX-Request": "true"})
            assert "a member may not" in answer.text, (path, answer.status_code, answer.text)
        assert "may not" in mia.post(f"/w/{world}/models", data={"base_url": llm_double.base_url}).text
        started = mia.post(f"/w/{world}/chats", data={"title": "Mia's"})
        assert started.status_code == 303, started.text
    finally:
        mia.close()
    info = owner.get(f"/api/worlds/{world}").json()
    assert [a["name"] for a in info["agents"]] == ["alice"] and info["settings"]["mcp_servers"] == []
    assert [c["title"] for c in info["chats"]] == ["Main", "Ops", "Mia's"]
    refused = [e for e in owner.get(f"/api/worlds/{world}/audit").json() if e.get("action") == "refused"]
    assert refused, "the refusals are audited"


def test_models_lists_the_endpoint_and_a_last_chat_cannot_be_deleted(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    listed = owner.post(f"/w/{world}/models", data={"base_url": llm_double.base_url, "list": "models-x"})
    assert '<datalist id="models-x" hx-swap-oob="true"><option value="double-model">' in listed.text, listed.text
    unreachable = owner.post(f"/w/{world}/models", data={"base_url": "http://127.0.0.1:9/v1"})
    assert "cannot reach http://127.0.0.1:9/v1: check the base URL" in unreachable.text
    main = owner.get(f"/api/worlds/{world}").json()["chats"][0]["id"]
    refused = owner.post(f"/w/{world}/chats/{main}/delete", headers={"HX-Request": "true"})
    assert "at least one chat" in refused.text


def test_a_browser_sees_errors_in_the_sites_layout(server: ServerProcess, owner: httpx.Client) -> None:
    page = owner.get("/w/no-such-world", headers={"Accept": "text/html"})
    assert page.status_code == 404
    assert '<link rel="stylesheet" href="/static/app.css">' in page.text and 'id="theme-toggle"' in page.text
    assert "<h1>Not found</h1>" in page.text and "no-such-world" in page.text
    api = owner.get("/api/worlds/no-such-world")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"  # the API stays JSON


def test_the_owner_is_warned_when_no_api_key_is_configured(tmp_path: Path, server: ServerProcess,
                                                           owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    """In the settings view, and only for the agents that need a key: those on api.openai.com (an agent of a
    local endpoint, the double here, works without one)."""
    warning = "OPENAI_API_KEY is not set on the server"
    world = make_world(owner, llm_double)
    assert warning not in owner.get(f"/w/{world}/settings", headers={"Accept": "text/html"}).text  # a key is set
    keyless = start_server(tmp_path / "keyless", llm=llm_double, extra_env={"OPENAI_API_KEY": ""})
    try:
        with client_for(keyless, keyless.token) as client:
            bare = make_world(client, llm_double)
            settings = f"/w/{bare}/settings"
            assert warning not in client.get(settings, headers={"Accept": "text/html"}).text  # the double's agent
            added = client.post(f"/api/worlds/{bare}/agents", json={
                "name": "gpt", "provider": "openai", "model": "gpt-4o", "base_url": "https://api.openai.com/v1"})
            assert added.status_code == 201, added.text
            page = client.get(settings, headers={"Accept": "text/html"})
            assert page.status_code == 200 and warning in page.text and "gpt (on api.openai.com)" in page.text
    finally:
        keyless.stop()
