"""The world's settings view (#31 item 10): the owner's administration on a page of its own, over the real app
in process; the world page's sidebar keeps what people use all day."""
from __future__ import annotations

import pytest

from server import events, vocab
from server.log import Tag
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


def _append_outcome(site: Site, kind: str, **more: int | str) -> None:
    """A webhook outcome on the record, as server/engine/notify/webhooks.py writes it after a delivery."""
    engine = site.client.app.state.ctx.engine  # type: ignore[attr-defined]
    event = events.webhook_outcome(kind, "hook12345678", "hooks.example.com", 3, "request", "test", **more)  # type: ignore[arg-type]
    site.client.portal.call(engine.store.append, site.world, event, [Tag(vocab.AUDIT_TAG)])  # type: ignore[union-attr]


def test_the_owner_manages_webhooks_and_escalation_from_the_settings_view(site: Site) -> None:
    hx, base = {"HX-Request": "true"}, f"/w/{site.world}"
    url, secret = "https://hooks.example.com/services/T0/B0/secretpath", "whsec_0123456789abcdefghij"
    form = {"url": url, "secret": secret, "format": "slack", "events": ["request", "escalation"]}
    added = site.page("owner", "POST", f"{base}/webhooks", data=form, headers=hx)
    assert added.status_code == 200 and 'id="notifications"' in added.text and "Saved." in added.text, added.text
    assert "hooks.example.com" in added.text and "secretpath" not in added.text and secret not in added.text

    def stored() -> dict[str, object]:
        settings: dict[str, object] = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]
        return settings
    hooks: list[dict[str, object]] = stored()["webhooks"]  # type: ignore[assignment]
    [shown] = hooks
    assert shown == {"url": "•••", "secret": "•••", "format": "slack", "events": ["request", "escalation"],
                     "allow_private": False, "id": shown["id"]}
    # Edited with ••• sent back: the stored URL and secret are kept; the page shows neither.
    edit = {"url": "•••", "secret": "•••", "format": "json", "events": ["decision"], "allow_private": "1"}
    edited = site.page("owner", "POST", f"{base}/webhooks/{shown['id']}", data=edit, headers=hx)
    assert "Saved." in edited.text and "secretpath" not in edited.text and secret not in edited.text, edited.text
    engine = site.client.app.state.ctx.engine  # type: ignore[attr-defined]
    [hook] = site.client.portal.call(engine.world_settings, site.world)["webhooks"]  # type: ignore[union-attr]
    assert (hook["url"], hook["secret"], hook["format"], hook["events"], hook["allow_private"]) == (
        url, secret, "json", ["decision"], True)
    # A bad one: the error beside its field, the values kept, nothing stored.
    bad = site.page("owner", "POST", f"{base}/webhooks", data={**form, "url": "ftp://x"}, headers=hx)
    assert 'id="webhook-new-url-error"' in bad.text and 'value="ftp://x"' in bad.text, bad.text
    assert len(stored()["webhooks"]) == 1  # type: ignore[arg-type]
    # Escalation.
    saved = site.page("owner", "POST", f"{base}/escalation", data={"escalate_after": "30", "escalate_to": "owner, max"},
                      headers=hx)
    assert "Saved." in saved.text and 'value="owner, max"' in saved.text, saved.text
    assert (stored()["escalate_after"], stored()["escalate_to"]) == (30, ["owner", "max"])
    zero = site.page("owner", "POST", f"{base}/escalation", data={"escalate_after": "0", "escalate_to": ""}, headers=hx)
    assert 'id="escalation-escalate_after-error"' in zero.text and stored()["escalate_after"] == 30, zero.text
    # The recent deliveries and their outcomes, from the record.
    _append_outcome(site, vocab.WEBHOOK_DELIVERED, attempts=1, status=200)
    _append_outcome(site, vocab.WEBHOOK_FAILED, attempts=4, error="HTTP 500", status=500)
    page = site.page("owner", "GET", f"{base}/settings", headers=HTML).text
    table = page.split('id="webhook-deliveries"', 1)[1].split("</table>", 1)[0]
    assert table.index("failed") < table.index("delivered") and "HTTP 500" in table and "HTTP 200" in table
    assert 'value="30"' in page and "hooks.example.com" in page and "secretpath" not in page
    assert "hooks.example.com" in site.page("owner", "GET", f"{base}/webhooks/deliveries", headers=hx).text
    [now] = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]["webhooks"]  # a new id: edited
    removed = site.page("owner", "POST", f"{base}/webhooks/{now['id']}/remove", headers=hx)
    assert "No webhooks." in removed.text and stored()["webhooks"] == []


def test_a_webhook_form_acts_on_the_webhook_it_showed_or_on_none(site: Site) -> None:
    hx, base = {"HX-Request": "true"}, f"/w/{site.world}"
    for host in ("a.example", "b.example"):
        site.page("owner", "POST", f"{base}/webhooks", data={"url": f"https://{host}/h", "events": ["request"]},
                  headers=hx)
    page = site.page("owner", "GET", f"{base}/settings", headers=HTML).text
    shown = {host: page.split(f"Remove the webhook to {host}?", 1)[0].rsplit('hx-post="', 1)[1].split('"', 1)[0]
             for host in ("a.example", "b.example")}  # each Remove button's path, as the page showed it
    # Meanwhile an API client removes a.example: b.example is first in the list now.
    hooks = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]["webhooks"]
    patched = site.api("owner", "PATCH", f"/api/worlds/{site.world}", json={"settings": {"webhooks": hooks[1:]}})
    assert patched.status_code == 200, patched.text
    engine = site.client.app.state.ctx.engine  # type: ignore[attr-defined]
    edit = {"url": "•••", "format": "slack", "events": ["decision"]}
    for path, data in ((shown["a.example"].removesuffix("/remove"), edit), (shown["a.example"], {})):
        gone = site.page("owner", "POST", path, data=data, headers=hx)
        assert gone.headers.get("HX-Reswap") == "none" and "no such webhook" in gone.text, gone.text
    [kept] = site.client.portal.call(engine.world_settings, site.world)["webhooks"]  # type: ignore[union-attr]
    assert (kept["url"], kept["format"], kept["events"]) == ("https://b.example/h", "json", ["request"])
    removed = site.page("owner", "POST", shown["b.example"], headers=hx)
    assert "No webhooks." in removed.text, removed.text


@pytest.mark.parametrize("role", ["member", "spectator"])
def test_members_and_spectators_can_neither_see_nor_change_webhooks_or_escalation(site: Site, role: str) -> None:
    hx, base = {"HX-Request": "true"}, f"/w/{site.world}"
    before = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]
    for path, data in ((f"{base}/webhooks", {"url": "https://example.com/h", "events": ["request"]}),
                       (f"{base}/escalation", {"escalate_after": "1", "escalate_to": role})):
        refused = site.page(role, "POST", path, data=data, headers=hx)
        assert refused.headers.get("HX-Reswap") == "none" and "toast" in refused.text, refused.text
    listing = site.page(role, "GET", f"{base}/webhooks/deliveries", headers=hx)
    assert 'id="webhook-deliveries"' not in listing.text and "toast" in listing.text, listing.text
    after = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]
    assert (after["webhooks"], after["escalate_after"]) == (before["webhooks"], before["escalate_after"])
    page = site.page(role, "GET", f"{base}/settings", headers=HTML)
    assert page.status_code == 403 and 'id="notifications"' not in page.text


def test_the_owner_picks_the_sandbox_network_mode_in_the_settings_form(site: Site) -> None:
    world = site.api("owner", "GET", f"/api/worlds/{site.world}").json()
    form = {"name": world["name"], "turn_limit": str(world["settings"]["turn_limit"]), "approval_timeout": "",
            "context_messages": str(world["settings"]["context_messages"])}
    for mode, stored in (("ask", "ask"), ("open", True), ("off", False)):
        saved = site.page("owner", "POST", f"/w/{site.world}/settings", data={**form, "sandbox_network": mode})
        assert "Saved." in saved.text and f'<option value="{mode}" selected>' in saved.text, saved.text[:500]
        assert site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]["sandbox_network"] == stored
    page = site.page("owner", "GET", f"/w/{site.world}/settings", headers=HTML)
    assert '<option value="off" selected>' in page.text
    site.page("owner", "POST", f"/w/{site.world}/settings", data={**form, "sandbox_network": "ask"})
    unnamed = site.page("owner", "POST", f"/w/{site.world}/settings", data=form)  # a form without the field
    assert '<option value="ask" selected>' in unnamed.text  # shown as kept, so the next save keeps it too
    before = site.events()
    refused = site.page("owner", "POST", f"/w/{site.world}/settings", data={**form, "sandbox_network": "all"})
    assert 'id="settings-sandbox_network-error"' in refused.text and "off, ask or open" in refused.text
    assert site.events() == before  # a refused form writes nothing
