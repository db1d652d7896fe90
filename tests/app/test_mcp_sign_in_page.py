"""An OAuth MCP server signed in from the page (issue #33), the app in process and a real authorization
server on loopback: the button answers a link to open (the host shown, nothing opened by itself), the
authorization server brings the browser back to /oauth/callback, which only the person who started the
sign-in can finish; the answers, pages and events never carry a token; signing out revokes."""
from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import urlsplit

from server.tools.mcp.oauth import VaultStorage
from server.tools.mcp.server import McpServerConfig
from tests.fixtures.eventually import eventually
from tests.fixtures.inprocess import Site
from tests.fixtures.mcp_oauth import OAuthServers

LINK = re.compile(r'<a class="mcp-sign-in-link" href="([^"]+)" target="_blank" rel="noopener noreferrer">')


def _tokens(site: Site, servers: OAuthServers) -> list[str]:
    engine = site.client.app.state.ctx.engine  # type: ignore[attr-defined]
    storage = VaultStorage(engine.mcp_sign_ins.vault, site.world, McpServerConfig(name="sec", url=servers.mcp_url,
                                                                                  oauth=True))
    record = site.client.portal.call(storage.record)  # type: ignore[union-attr]
    tokens = record.get("tokens") or {}
    return [tokens[k] for k in ("access_token", "refresh_token") if tokens.get(k)]


def test_the_owner_signs_in_from_the_page_and_only_they_finish_it(site: Site, oauth_servers: OAuthServers) -> None:
    w = f"/api/worlds/{site.world}"
    patched = site.api("owner", "PATCH", w, json={"settings": {"mcp_servers": [
        {"name": "sec", "url": oauth_servers.mcp_url, "oauth": True}]}})
    assert patched.status_code == 200, patched.text
    settings = site.page("owner", "GET", f"/w/{site.world}/settings")
    assert "Sign in to sec" in settings.text and "Not signed in." in settings.text
    refused = site.page("member", "POST", f"/w/{site.world}/mcp/sec/sign-in")  # a toast, no link
    assert "a member may not sign in to MCP server sec" in refused.text and not LINK.search(refused.text)

    controls = site.page("owner", "POST", f"/w/{site.world}/mcp/sec/sign-in")
    assert controls.status_code == 200, controls.text
    [url] = LINK.findall(controls.text)
    url = url.replace("&amp;", "&")
    assert f'<b class="mcp-sign-in-host">{oauth_servers.host}</b>' in controls.text
    assert url.startswith(oauth_servers.issuer + "/authorize?")

    location = asyncio.run(oauth_servers.approve(url))  # the person, signed in at the authorization server
    back = urlsplit(location)
    public_url = site.client.app.state.ctx.public_url  # type: ignore[attr-defined]
    assert f"{back.scheme}://{back.netloc}{back.path}" == f"{public_url}/oauth/callback"  # the registered redirect
    callback = f"{back.path}?{back.query}"
    elsewhere = site.page("member", "GET", callback)  # another person's browser
    assert elsewhere.status_code == 403 and "started by someone else" in elsewhere.text
    assert site.page(None, "GET", callback).status_code == 403
    done = site.page("owner", "GET", callback)
    assert done.status_code == 200 and "Signed in to sec" in done.text, done.text
    assert done.headers["cache-control"] == "no-store" and done.headers["referrer-policy"] == "no-referrer"
    assert site.page("owner", "GET", callback).status_code == 404  # used once

    eventually(lambda: site.api("owner", "GET", w).json()["mcp_status"]["sec"], timeout=20,
               accept=lambda status: status["state"] == "up" and status["signed_in"] is True,
               what="the server signed in and up")
    tokens = _tokens(site, oauth_servers)
    assert len(tokens) == 2
    answers = [controls.text, done.text, site.api("owner", "GET", w).text, json.dumps(site.events()),
               site.page("owner", "GET", f"/w/{site.world}/settings").text,
               site.api("owner", "GET", f"{w}/audit").text, site.page("owner", "GET", f"/w/{site.world}").text]
    assert "Signed in." in answers[4]
    for token in tokens:
        assert not [a for a in answers if token in a]
    assert [e["host"] for e in site.events() if e["kind"] == "mcp_signed_in"] == [oauth_servers.host]

    out = site.page("owner", "POST", f"/w/{site.world}/mcp/sec/sign-out")
    assert out.status_code == 200 and "Not signed in." in out.text
    assert asyncio.run(oauth_servers.stats())["revoked"] >= 1
    assert asyncio.run(oauth_servers.call(tokens[0])) == 401
    assert [e["revoked"] for e in site.events() if e["kind"] == "mcp_signed_out"] == [True]


def test_an_unknown_or_missing_state_is_not_found(site: Site) -> None:
    for query in ("?code=x&state=nope", "?code=x", "?error=access_denied"):
        answer = site.page("owner", "GET", f"/oauth/callback{query}")
        assert answer.status_code == 404 and "start it again" in answer.text


def test_the_page_form_adds_an_oauth_server_and_an_edit_can_drop_it(site: Site) -> None:
    added = site.page("owner", "POST", f"/w/{site.world}/mcp",
                      data={"name": "lin", "url": "https://mcp.example.com/mcp", "oauth": "1"})
    assert added.status_code == 200 and "Sign in to lin" in added.text, added.text
    stored = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]["mcp_servers"]
    assert [s.get("oauth") for s in stored if s["name"] == "lin"] == [True]
    edited = site.page("owner", "POST", f"/w/{site.world}/mcp/lin", data={"url": "https://mcp.example.com/mcp"})
    assert "Sign in to lin" not in edited.text
    stored = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]["mcp_servers"]
    assert [s.get("oauth") for s in stored if s["name"] == "lin"] == [None]
    site.page("owner", "POST", f"/w/{site.world}/mcp/lin/remove")
    for wrong, why in (({"name": "cmd", "command": "echo", "oauth": True}, "headers and oauth go with a url"),
                       ({"name": "lin", "url": "https://mcp.example.com/mcp", "oauth": "yes"}, "oauth is true")):
        refused = site.api("owner", "PATCH", f"/api/worlds/{site.world}", json={"settings": {"mcp_servers": [wrong]}})
        assert refused.status_code == 400 and why in refused.json()["error"]["message"], refused.text


def test_the_page_form_gives_a_registered_client_whose_secret_it_never_shows(site: Site) -> None:
    form = {"name": "gh", "url": "https://mcp.example.com/mcp", "oauth": "1", "oauth_issuer": "https://gh.example",
            "oauth_client_id": "Iv1.abc", "oauth_client_secret": "s3cret-value-of-the-client"}
    added = site.page("owner", "POST", f"/w/{site.world}/mcp", data=form)
    assert added.status_code == 200 and "Sign in to gh" in added.text and "s3cret" not in added.text, added.text
    assert 'name="oauth_client_id" type="text" value="Iv1.abc"' in added.text
    assert 'name="oauth_client_secret" type="password" value="•••"' in added.text

    def client() -> object:
        stored = site.api("owner", "GET", f"/api/worlds/{site.world}").json()["settings"]["mcp_servers"]
        return next(s["oauth"] for s in stored if s["name"] == "gh")
    kept = {"issuer": "https://gh.example", "client_id": "Iv1.abc", "client_secret": "•••",
            "token_endpoint_auth_method": "client_secret_basic"}
    assert client() == kept
    # Saved again as shown (•••): the stored secret is kept; a new id with no secret: a public client.
    site.page("owner", "POST", f"/w/{site.world}/mcp/gh", data={**form, "oauth_client_secret": "•••"})
    assert client() == kept
    # A form refused is shown again without the secret typed into it.
    refused = site.page("owner", "POST", f"/w/{site.world}/mcp/gh",
                        data={**form, "oauth_issuer": "ftp://x", "oauth_client_secret": "an0ther-secret-typed"})
    assert "oauth.issuer is the http" in refused.text and "an0ther" not in refused.text
    assert 'name="oauth_client_secret" type="password" value=""' in refused.text  # typed again, not kept unseen
    lone = site.page("owner", "POST", f"/w/{site.world}/mcp/gh", data={**form, "oauth_client_id": ""})
    assert "give the client ID that goes with this issuer or secret" in lone.text
    site.page("owner", "POST", f"/w/{site.world}/mcp/gh",
              data={**form, "oauth_client_id": "pub", "oauth_client_secret": ""})
    assert client() == {"issuer": "https://gh.example", "client_id": "pub", "token_endpoint_auth_method": "none"}
    site.page("owner", "POST", f"/w/{site.world}/mcp/gh/remove")
