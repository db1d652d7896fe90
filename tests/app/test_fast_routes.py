"""Pages, forms, access rules and the JSON API in-process (Starlette's TestClient): the fast layer.

`pytest -m fast` runs this file and the fragment tests in seconds. What needs a real socket (WebSockets,
restarts, proxies, browsers) stays in the other files; this one pins who may see and change what.
"""
from __future__ import annotations

import re

import pytest
from starlette.routing import Route

from tests.fixtures.inprocess import ROLES, Site

WRITES = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# Not a world's writes: signing in and out, and the AG-UI run endpoint (its own access rules and tests in
# tests/system/test_agui.py: a spectator may watch a run there).
NOT_WORLD_WRITES = {"/login", "/logout", "/api/worlds/{world}/agui"}


def _pages(world: str) -> dict[str, dict[str, tuple[int, str]]]:
    """Path -> role -> (status, what the answer holds: text of the page or where it redirects)."""
    lab = f"/w/{world}"
    return {
        "/": {"owner": (200, "Lab"), "member": (303, lab), "spectator": (303, lab)},
        lab: {role: (200, "alice") for role in ROLES},
        f"{lab}/audit": {role: (200, "Audit") for role in ROLES},
        "/w/nowhere": {"owner": (404, ""), "member": (403, ""), "spectator": (403, "")},
        "/w/nowhere/audit": {"owner": (404, ""), "member": (403, ""), "spectator": (403, "")},
    }


@pytest.mark.parametrize("role", ROLES)
def test_every_page_renders_for_each_role_with_its_status(site: Site, role: str) -> None:
    for path, by_role in _pages(site.world).items():
        status, holds = by_role[role]
        answer = site.page(role, "GET", path)
        assert answer.status_code == status, (path, answer.text[:500])
        if status == 303:
            assert answer.headers["location"] == holds, path
        else:
            assert holds in answer.text, (path, answer.text[:500])


def test_signed_out_pages_ask_to_sign_in(site: Site) -> None:
    for path in ("/", f"/w/{site.world}", f"/w/{site.world}/audit"):
        answer = site.page(None, "GET", path)
        assert answer.status_code == 401 and "sign" in answer.text.lower(), (path, answer.text[:300])


def _concrete(path: str, world: str) -> str:
    names = {"world": world, "name": "alice", "chat": "main"}
    return re.sub(r"\{(\w+)\}", lambda m: names.get(m.group(1), "x1"), path)


def test_a_spectators_every_write_route_is_refused_and_writes_nothing(site: Site) -> None:
    before = site.events()
    tried = 0
    for route in site.client.app.routes:  # type: ignore[attr-defined]
        if not isinstance(route, Route) or route.path in NOT_WORLD_WRITES:
            continue
        for method in sorted((route.methods or set()) & WRITES):
            path, tried = _concrete(route.path, site.world), tried + 1
            if path.startswith("/api/"):
                # A body each route would take from someone allowed: refusal must come from the role.
                body = {"name": "x"} if method == "PATCH" else {"name": "x", "content": "x", "role": "member"}
                answer = site.api("spectator", method, path, json=body)
                assert answer.status_code == 403, (method, path, answer.text)
                assert answer.json()["error"]["code"] == "forbidden"
            else:
                answer = site.page("spectator", method, path, data={"name": "x", "title": "x", "role": "member"})
                # A refused htmx form answers a toast (200, nothing swapped); others answer 403.
                refused = answer.status_code == 403 or (
                    answer.status_code == 200 and "a spectator may not" in answer.text)
                assert refused, (method, path, answer.status_code, answer.text[:300])
    assert tried >= 30  # every write route of the API and the pages was found
    assert site.events() == before
    assert site.page("spectator", "GET", f"/w/{site.world}").status_code == 200  # still signed in: no /logout


def test_the_owners_forms_answer_bad_input_with_inline_errors_and_keep_the_values(site: Site) -> None:
    before = site.events()
    settings = site.page("owner", "POST", f"/w/{site.world}/settings",
                         data={"name": "Kept name", "turn_limit": "many", "approval_timeout": "",
                               "context_messages": "200"})
    assert settings.status_code == 200, settings.text[:300]
    assert 'id="settings-turn_limit" name="turn_limit" type="number" value="many"' in settings.text
    assert 'aria-describedby="settings-turn_limit-error"' in settings.text
    assert 'id="settings-turn_limit-error"' in settings.text and 'value="Kept name"' in settings.text
    agent = site.page("owner", "POST", f"/w/{site.world}/agents",
                      data={"name": "", "provider": "openai", "model": "m", "base_url": "not a url"})
    assert agent.status_code == 200, agent.text[:300]
    assert 'class="field-error"' in agent.text and 'aria-invalid="true"' in agent.text
    assert site.events() == before  # a refused form writes nothing


def test_a_chat_rename_answers_its_errors_inline_in_the_form(site: Site) -> None:
    """The rename form, as the others: an empty or too long title, or a chat deleted meanwhile, is shown in the
    form (its <details> open, the typed title kept), not on the site's error page (which it was before)."""
    chat = site.api("owner", "POST", f"/api/worlds/{site.world}/chats", json={"title": "Ops"}).json()["id"]
    path, hx = f"/w/{site.world}/chats/{chat}/rename", {"HX-Request": "true"}
    before = site.events()
    for typed in ("", "x" * 201):
        answer = site.page("owner", "POST", path, data={"title": typed}, headers=hx)
        assert answer.status_code == 200, answer.text[:300]
        assert answer.text.lstrip().startswith('<details class="edit" open>'), answer.text[:300]
        error = f'<p class="field-error" id="rename-{chat}-title-error">a chat title is 1 to 200 characters'
        assert error in answer.text
        assert f'value="{typed}"' in answer.text and 'aria-invalid="true"' in answer.text
        assert "Rename or delete the chat Ops" in answer.text  # the chat's own title, not the typed one
    assert site.events() == before  # nothing was renamed
    renamed = site.page("owner", "POST", path, data={"title": "Release"}, headers=hx)
    assert renamed.status_code == 200 and renamed.text.lstrip().startswith('<details class="edit">'), renamed.text
    assert 'aria-label="Rename or delete the chat Release"' in renamed.text and "field-error" not in renamed.text
    assert site.page("owner", "POST", f"/w/{site.world}/chats/{chat}/delete", headers=hx).status_code == 204
    gone = site.page("owner", "POST", path, data={"title": "Again"}, headers=hx)
    assert gone.status_code == 200, gone.text[:300]
    # Found by a user: errors on the page named the chat and the world by their ids.
    assert '<p class="field-error">This chat was deleted.' in gone.text and 'value="Again"' in gone.text
    error = gone.text.split('<p class="field-error">')[1].split("</p>")[0]
    assert chat not in error and site.world not in error and f"the chat {chat}" not in gone.text


def test_the_json_api_main_routes(site: Site) -> None:
    made = site.api("owner", "POST", "/api/worlds", json={"name": "Api World"})
    assert made.status_code == 201, made.text
    world = made.json()["id"]
    base = f"/api/worlds/{world}"
    assert world in [w["id"] for w in site.api("owner", "GET", "/api/worlds").json()]
    renamed = site.api("owner", "PATCH", base, json={"name": "Renamed", "settings": {"turn_limit": 3}})
    assert renamed.status_code == 200 and renamed.json()["settings"]["turn_limit"] == 3
    chat = site.api("owner", "POST", f"{base}/chats", json={"title": "Second"})
    assert chat.status_code == 201 and chat.json()["title"] == "Second"
    assert "Second" in [c["title"] for c in site.api("owner", "GET", f"{base}/chats").json()]
    said = site.api("owner", "POST", f"{base}/messages", json={"content": "hello there"})
    assert said.status_code == 201, said.text
    events = site.api("owner", "GET", f"{base}/events", params={"after": 0}).json()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["content"] == "hello there"
    later = site.api("owner", "GET", f"{base}/events", params={"after": events[-2]["seq"]}).json()
    assert later == events[-1:]
    assert site.api("owner", "GET", f"{base}/snapshot").status_code == 200
    assert site.api("owner", "GET", f"{base}/approvals/pending").json() == []
    rule = site.api("owner", "POST", f"{base}/rules", json={"tool": "shell_exec", "effect": "allow"})
    assert rule.status_code == 201, rule.text
    assert [r["id"] for r in site.api("owner", "GET", f"{base}/rules").json()] == [rule.json()["id"]]
    assert site.api("owner", "DELETE", f"{base}/rules/{rule.json()['id']}").status_code == 204
    invited = site.api("owner", "POST", f"{base}/invites", json={"role": "member", "name": "mia"})
    assert invited.status_code == 201 and invited.json()["role"] == "member"
    assert site.api("owner", "DELETE", f"{base}/invites/{invited.json()['id']}").status_code == 204
    me = site.api("member", "GET", "/api/me").json()
    assert me == {"name": "member", "owner": False, "world": site.world, "role": "member"}
    assert site.api("member", "GET", base).status_code == 403  # another world than the invite's
    assert site.api("owner", "DELETE", base).status_code == 204
    assert site.api("owner", "GET", base).status_code == 404
