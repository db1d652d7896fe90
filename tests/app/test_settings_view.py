"""The world's settings view (#31 item 10): the owner's administration on a page of its own, over the real app
in process; the world page's sidebar keeps what people use all day."""
from __future__ import annotations

import pytest

from tests.fixtures.inprocess import Site
from web.render import render_event

HTML = {"Accept": "text/html"}
ADMIN = ('id="agent-form"', 'id="settings-form"', 'id="mcp"', 'id="rules"', 'id="grants"', 'id="invites"',
         'aria-label="Edit alice"', 'aria-label="Test alice"', 'aria-label="Remove alice"')


def test_the_owner_settings_view_holds_the_administration(site: Site) -> None:
    page = site.page("owner", "GET", f"/w/{site.world}/settings", headers=HTML)
    assert page.status_code == 200, page.text
    for part in (*ADMIN, 'id="agent-config-alice"', 'id="rule-form"', 'ws-connect="/w/'):
        assert part in page.text, part
    assert page.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("role", ["owner", "member", "spectator"])
def test_the_world_page_sidebar_keeps_the_day_and_no_administration(site: Site, role: str) -> None:
    page = site.page(role, "GET", f"/w/{site.world}", headers=HTML)
    assert page.status_code == 200, page.text
    sidebar = page.text.split('id="sidebar"', 1)[1].split("</aside>", 1)[0]
    for part in ('id="agents"', 'id="agent-alice"', 'id="status-alice"', 'id="chats"', 'id="members"',
                 'id="files-panel"'):
        assert part in sidebar, part
    for part in ADMIN:
        assert part not in page.text, part
    link = f'href="/w/{site.world}/settings"'
    assert (link in sidebar) is (role == "owner")


@pytest.mark.parametrize("role", ["member", "spectator"])
def test_only_the_owner_may_open_the_settings_view(site: Site, role: str) -> None:
    page = site.page(role, "GET", f"/w/{site.world}/settings", headers=HTML)
    assert page.status_code == 403, page.text
    assert "Not allowed" in page.text and 'id="agent-form"' not in page.text
    assert site.page(None, "GET", f"/w/{site.world}/settings", headers=HTML).status_code == 401


def test_a_rule_added_from_the_settings_view_is_listed_or_its_error_shown_beside_its_field(site: Site) -> None:
    form = {"tool": "shell_exec", "argument": "command", "glob": "git status*", "effect": "allow"}
    added = site.page("owner", "POST", f"/w/{site.world}/rules", data=form, headers={"HX-Request": "true"})
    assert added.status_code == 200 and "Added." in added.text and "field-error" not in added.text, added.text
    rules = site.api("owner", "GET", f"/api/worlds/{site.world}/rules").json()
    assert [(r["tool"], r["match"], r["effect"]) for r in rules] == [
        ("shell_exec", {"command": "git status*"}, "allow")]
    try:
        lone = site.page("owner", "POST", f"/w/{site.world}/rules", data={**form, "argument": ""},
                         headers={"HX-Request": "true"})
        assert 'id="rule-argument-error"' in lone.text and 'value="git status*"' in lone.text, lone.text
        refused = site.page("member", "POST", f"/w/{site.world}/rules", data=form, headers={"HX-Request": "true"})
        assert refused.headers.get("HX-Reswap") == "none" and "toast" in refused.text, refused.text
        assert len(site.api("owner", "GET", f"/api/worlds/{site.world}/rules").json()) == 1
    finally:
        for rule in site.api("owner", "GET", f"/api/worlds/{site.world}/rules").json():
            site.api("owner", "DELETE", f"/api/worlds/{site.world}/rules/{rule['id']}")


@pytest.mark.parametrize("kind", ["agent_added", "agent_updated", "agent_removed"])
def test_an_agents_live_fragment_reaches_the_settings_view_of_owners_only(kind: str) -> None:
    agent = {"name": "carol", "provider": "openai", "model": "m", "base_url": None, "tools": None}
    event: dict[str, object] = {"kind": kind, "seq": 7, "world": "lab", "agent": agent, "name": "carol"}
    owner = render_event(event, "owner", frozenset()).elsewhere
    member = render_event(event, "member", frozenset()).elsewhere
    assert 'id="agent-config-carol"' in owner and 'id="agent-config-carol"' not in member
    assert ("Edit carol" in owner) is (kind != "agent_removed") and "Edit carol" not in member
    sidebar = 'id="agent-meta-carol"' if kind == "agent_updated" else 'id="agent-carol"'
    assert sidebar in owner and sidebar in member
