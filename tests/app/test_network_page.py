"""The `ask` network mode on the page (issue #33), over the real app in process: a network request reads
as the connection it is, and the package registries are offered as rules, never in force by themselves."""
from __future__ import annotations

import html
from typing import Any

from server import events
from server.tools.egress.hosts import NETWORK, PACKAGE_REGISTRIES
from tests.fixtures.inprocess import Site
from web.render import render_event

HX = {"HX-Request": "true"}


def network_rules(site: Site) -> list[dict[str, Any]]:
    rules = site.api("owner", "GET", f"/api/worlds/{site.world}/rules").json()
    return [r for r in rules if r["tool"] == NETWORK]


def test_the_package_registries_are_offered_and_added_only_by_the_owner_as_ordinary_rules(site: Site) -> None:
    page = site.page("owner", "GET", f"/w/{site.world}/settings", headers={"Accept": "text/html"})
    offered = page.text.split('id="network-defaults"', 1)[1].split("</details>", 1)[0]
    assert all(f"<code>{host}</code>" in offered for host in PACKAGE_REGISTRIES), offered
    assert network_rules(site) == []  # offered, not in force
    assert "network mode is off" in offered  # and said to matter only in the `ask` mode
    asking = site.api("owner", "PATCH", f"/api/worlds/{site.world}", json={"settings": {"sandbox_network": "ask"}})
    assert asking.status_code == 200, asking.text

    refused = site.page("member", "POST", f"/w/{site.world}/rules/package-registries", headers=HX)
    assert "toast" in refused.text and network_rules(site) == [], refused.text

    added = site.page("owner", "POST", f"/w/{site.world}/rules/package-registries", headers=HX)
    assert added.status_code == 200 and f"Added {len(PACKAGE_REGISTRIES)} rules." in added.text, added.text
    assert "network mode is" not in added.text
    rules = network_rules(site)
    assert sorted((r["match"]["host"], r["effect"]) for r in rules) == sorted(
        (host, "allow") for host in PACKAGE_REGISTRIES)
    # Each is a rule like any other: one revoked, the rest stay; adding again restores only that one.
    pypi = next(r for r in rules if r["match"] == {"host": "pypi.org:443"})
    assert site.api("owner", "DELETE", f"/api/worlds/{site.world}/rules/{pypi['id']}").status_code == 204
    assert len(network_rules(site)) == len(PACKAGE_REGISTRIES) - 1
    again = site.page("owner", "POST", f"/w/{site.world}/rules/package-registries", headers=HX)
    assert "Added 1 rule." in again.text, again.text
    assert "All of them are rules already." in site.page(
        "owner", "POST", f"/w/{site.world}/rules/package-registries", headers=HX).text
    assert len(network_rules(site)) == len(PACKAGE_REGISTRIES)
    for rule in network_rules(site):
        site.api("owner", "DELETE", f"/api/worlds/{site.world}/rules/{rule['id']}")


def request_fragment(host: str) -> str:
    request = {"toolCallId": "call_1", "toolName": NETWORK, "toolArguments": {"host": host},
               "message": f"alice's `shell_exec` (in chat Ops) wants to reach {host}",
               "options": ["deny", "approve_once", "approve_session", "approve_always"], "expiresAt": None,
               "network": {"host": host.rpartition(":")[0], "port": 443, "tool": "shell_exec"}}
    event = {**events.approval_request("chat_1", "alice", "approval_call_1.net1", request), "seq": 5,
             "world": "w", "ts": "2026-11-27T10:00:00Z"}
    return render_event(event, "owner", frozenset()).elsewhere


def test_a_network_request_reads_as_a_connection_with_its_host_shown_as_it_is() -> None:
    fragment = request_fragment("api.example.com:443")
    head = html.unescape(fragment.split('class="approval-head">', 1)[1].split("</header>", 1)[0])
    assert "alice</span>'s <code class=\"tool\">shell_exec</code> wants to reach" in head, head
    assert '<code class="host">api.example.com:443</code>' in head and "wants to run" not in head, head
    assert 'data-host="api.example.com:443"' in fragment
    assert 'class="edit"' not in fragment  # approved or denied as asked: never edited
    assert "internationalized" not in fragment
    # A look-alike name arrives as its punycode (the proxy takes only ASCII names) and is said to be one.
    assert "An internationalized name" in request_fragment("xn--ypi-zed.org:443")
    # Were a hidden character ever in one, it is shown escaped and warned of, as in any request.
    hidden = request_fragment("pypi.org\u200b:443")
    assert '<mark class="hidden-char"' in hidden.split("</header>", 1)[0] and "\u200b" not in hidden, hidden
