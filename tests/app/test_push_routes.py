"""`/api/push/subscriptions`: each person's own devices, listed and removed by them alone (issue #32 item 1)."""
from __future__ import annotations

import base64
import secrets

from tests.fixtures.inprocess import Site

PATH = "/api/push/subscriptions"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def subscription(host: str = "push.example.net") -> dict[str, object]:
    """A browser's PushSubscription.toJSON() (the keys' shapes are checked, not their maths)."""
    return {"endpoint": f"https://{host}/send/{secrets.token_hex(8)}", "expirationTime": None,
            "keys": {"p256dh": _b64(b"\x04" + secrets.token_bytes(64)), "auth": _b64(secrets.token_bytes(16))}}


def test_subscriptions_are_per_person_and_removable(site: Site) -> None:
    made = site.page("owner", "POST", PATH, json={**subscription(), "label": "Chromium on Linux"})
    assert made.status_code == 201, made.text
    mine = site.page("owner", "GET", PATH).json()
    assert len(mine["key"]) == 87 and [s["label"] for s in mine["subscriptions"]] == ["Chromium on Linux"]
    assert "keys" not in mine["subscriptions"][0]
    assert site.page("member", "GET", PATH).json()["subscriptions"] == []
    sub_id = made.json()["id"]
    assert site.page("member", "DELETE", f"{PATH}/{sub_id}").status_code == 404
    assert site.page("owner", "DELETE", f"{PATH}/{sub_id}").status_code == 204
    assert site.page("owner", "GET", PATH).json()["subscriptions"] == []


def test_the_same_device_subscribing_again_replaces_its_record(site: Site) -> None:
    device = subscription()
    for _ in range(2):
        assert site.api("member", "POST", PATH, json=device).status_code == 201
    assert [s["endpoint"] for s in site.api("member", "GET", PATH).json()["subscriptions"]] == [device["endpoint"]]


def test_spectator_cannot_subscribe(site: Site) -> None:
    answer = site.page("spectator", "POST", PATH, json=subscription())
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"


def test_only_https_endpoints_and_real_key_shapes_are_accepted(site: Site) -> None:
    plain = {**subscription(), "endpoint": "http://127.0.0.1:6379/"}
    short = {**subscription(), "keys": {"p256dh": _b64(b"\x04" * 10), "auth": _b64(b"a" * 16)}}
    for body in (plain, short, {**subscription(), "extra": 1}):
        answer = site.page("owner", "POST", PATH, json=body)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid", answer.text


def test_signed_out_gets_nothing(site: Site) -> None:
    assert site.page(None, "GET", PATH).status_code == 401


def test_an_endpoint_on_a_loopback_private_or_link_local_address_is_refused(site: Site) -> None:
    """The server posts to every endpoint it keeps: one that points inside (its own loopback, the cloud's
    metadata address, a private network) would make it a proxy into them."""
    hosts = ("127.0.0.1", "localhost", "[::1]", "169.254.169.254", "10.1.2.3", "192.168.0.9", "[fe80::1]")
    for host in hosts:
        answer = site.page("member", "POST", PATH, json=subscription(host))
        assert answer.status_code == 400, (host, answer.text)
        assert "a push endpoint may not point there" in answer.json()["error"]["message"], answer.text
    kept = site.page("member", "GET", PATH).json()["subscriptions"]
    assert not [s for s in kept if any(f"//{host}/" in s["endpoint"] for host in hosts)]


def test_an_endpoint_whose_host_cannot_be_looked_up_yet_is_kept_not_a_500(site: Site) -> None:
    # The name cannot be looked up now (the resolver's UnicodeError): stored, as any name that does not
    # resolve yet, and checked where it is connected to.
    answer = site.page("member", "POST", PATH, json=subscription(f"{'a' * 64}.example.net"))
    assert answer.status_code == 201, answer.text
