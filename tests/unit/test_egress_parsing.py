"""What the `ask` mode's proxy reads (server/tools/egress/): request heads, a ClientHello's server name,
host patterns, and which addresses a name may lead to."""
from __future__ import annotations

import ipaddress
import ssl
from typing import Any

import pytest

from server.engine.actors import SYSTEM
from server.engine.approvals.decisions import Decision
from server.engine.approvals.policy import evaluate, grant_applies
from server.engine.approvals.rules import RuleBook
from server.engine.calls.refs import CallRef
from server.tools.egress.addresses import refusal, resolve
from server.tools.egress.heads import parse_head
from server.tools.egress.hosts import NETWORK_TOOL, BadHost, host_glob, host_port, split_host_port
from server.tools.egress.tls import handshake_message, is_tls, record_length, server_name
from server.webhooks import targets


def client_hello(name: str | None) -> bytes:
    """The ClientHello Python's ssl really sends for `name` (None: an IP address, no SNI)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name or "1.2.3.4")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def in_two_records(hello: bytes) -> tuple[bytes, bytes]:
    """The same ClientHello as two TLS records (legal: a handshake message may span records), the first
    ending before the extensions (and the server name)."""
    message = hello[5:]
    body = message[4:]
    at = 2 + 32
    at += 1 + body[at]
    at += 2 + int.from_bytes(body[at:at + 2], "big")
    at += 1 + body[at]

    def record(fragment: bytes) -> bytes:
        return b"\x16\x03\x01" + len(fragment).to_bytes(2, "big") + fragment

    return record(message[:4 + at]), record(message[4 + at:])


def test_connect_names_host_and_port_and_a_plain_request_is_rewritten_to_one_request() -> None:
    assert parse_head(b"CONNECT PyPI.org.:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n").host == "pypi.org"
    assert parse_head(b"CONNECT XN--ypi-zed.org:443 HTTP/1.1\r\n\r\n").host == "xn--ypi-zed.org"  # as asked
    tunnel = parse_head(b"CONNECT [2001:DB8::1]:8443 HTTP/1.1\r\n\r\n")
    assert (tunnel.host, tunnel.port, tunnel.tunnel) == ("2001:db8::1", 8443, True)
    plain = parse_head(b"GET http://user:pw@example.com/a?b HTTP/1.1\r\nHost: example.com\r\n"
                       b"Proxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n")
    assert (plain.host, plain.port, plain.tunnel) == ("example.com", 80, False)
    assert plain.forward == (b"GET /a?b HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n")


@pytest.mark.parametrize("head", [b"GET /relative HTTP/1.1\r\n\r\n", b"GET https://x.org/ HTTP/1.1\r\n\r\n",
                                  b"CONNECT x.org HTTP/1.1\r\n\r\n", b"CONNECT x.org:0 HTTP/1.1\r\n\r\n",
                                  b"CONNECT x.org:99999 HTTP/1.1\r\n\r\n", b"CONNECT a b:1 HTTP/1.1\r\n\r\n",
                                  b"CONNECT ev!l.org:443 HTTP/1.1\r\n\r\n", b"CONNECT 1.2.3:443 HTTP/1.1\r\n\r\n",
                                  b"CONNECT x.org:443 SPDY/3\r\n\r\n", "CONNECT é.org:443 HTTP/1.1\r\n\r\n".encode(),
                                  # a hidden character, a look-alike letter: never asked about (punycode is)
                                  "CONNECT py\u200bpi.org:443 HTTP/1.1\r\n\r\n".encode(),
                                  "CONNECT \u0440ypi.org:443 HTTP/1.1\r\n\r\n".encode(),
                                  "GET http://\u0440ypi.org/ HTTP/1.1\r\n\r\n".encode()])
def test_a_request_that_names_no_clear_host_and_port_is_refused(head: bytes) -> None:
    with pytest.raises(BadHost):
        parse_head(head)


def test_the_server_name_is_read_from_a_real_client_hello() -> None:
    hello = client_hello("api.github.com")
    assert is_tls(hello) and record_length(hello) == len(hello)
    assert server_name(hello) == "api.github.com"
    assert server_name(client_hello(None)) is None  # an IP address is sent no SNI
    with pytest.raises(ValueError):
        server_name(hello[:60])
    assert not is_tls(b"GET / HTTP/1.1\r\n")


def test_host_patterns_are_rules_of_the_network_tool_and_grants_hold_one_host() -> None:
    def rule(match: str, effect: str) -> dict[str, object]:
        return {"rule": {"id": "r", "tool": "network", "match": {"host": match}, "effect": effect, "by": "owner"}}

    def verdict(host: str, *rules: dict[str, object]) -> str:
        return evaluate(NETWORK_TOOL, {"host": host}, agent="a", chat="c", rules=list(rules), grants=[]).verdict

    assert verdict("files.pypi.org:443") == "ask"  # nothing is allowed by itself
    assert verdict("files.pypi.org:443", rule("*.pypi.org:443", "allow")) == "allow"
    assert verdict("pypi.org:443", rule("*.pypi.org:443", "allow")) == "ask"
    assert verdict("files.pypi.org:80", rule("*.pypi.org:443", "allow")) == "ask"
    assert verdict("evil.com:443", rule("*.pypi.org:443", "allow")) == "ask"
    assert verdict("x.pypi.org:443", rule("*.pypi.org:443", "allow"), rule("x.*", "deny")) == "deny"
    grant = {"tool": "network", "agent": "a", "chat": "c", "match": {"host": "pypi.org:443"}}
    assert grant_applies(grant, "network", "a", "c", {"host": "pypi.org:443"})
    assert not grant_applies(grant, "network", "a", "c", {"host": "pypi.org:80"})
    assert host_port("2001:db8::1", 443) == "[2001:db8::1]:443"
    assert split_host_port("[2001:db8::1]:443") == ("2001:db8::1", 443)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.1", "172.16.3.4", "192.168.1.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1",
                                     "224.0.0.1"])
def test_private_loopback_link_local_and_shared_addresses_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address))


async def test_a_name_is_refused_when_any_of_its_addresses_is_refused() -> None:
    assert refusal(ipaddress.ip_address("1.2.3.4")) == ""
    assert [str(a) for a in await resolve("1.2.3.4", 80)] == ["1.2.3.4"]
    with pytest.raises(BadHost, match="loopback"):
        await resolve("localhost", 80)  # the hosts file's answer
    with pytest.raises(BadHost, match="private"):
        await resolve("10.1.2.3", 80)


def test_a_client_hello_over_two_records_is_read_whole_and_not_before() -> None:
    first, second = in_two_records(client_hello("evil.example"))
    assert handshake_message(first) is None  # more to come: not "a hello without a server name"
    with pytest.raises(ValueError):
        server_name(first)
    assert server_name(first + second) == "evil.example"
    assert handshake_message(b"\x16\x03") is None
    with pytest.raises(ValueError):
        handshake_message(first + b"\x17\x03\x03\x00\x01x")  # another kind of record in the middle


def test_a_plain_request_goes_with_the_host_of_its_url_and_a_body_framing_read_one_way() -> None:
    plain = parse_head(b"POST http://allowed.example:8080/p HTTP/1.1\r\nHost: evil.example\r\nhost: x\r\n"
                       b"Content-Length: 5\r\n\r\n")
    assert plain.forward == (b"POST /p HTTP/1.1\r\nHost: allowed.example:8080\r\nContent-Length: 5\r\n"
                             b"Connection: close\r\n\r\n")
    assert (plain.length, plain.chunked) == (5, False)
    assert b"Host: [2001:db8::1]\r\n" in parse_head(b"GET http://[2001:db8::1]/ HTTP/1.1\r\n\r\n").forward
    assert parse_head(b"PUT http://a.org/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").chunked
    for head in (b"Transfer-Encoding: gzip, chunked\r\n", b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                 b"Content-Length: 3\r\nContent-Length: 4\r\n", b"Content-Length: -1\r\n",
                 b"X: a\nHost: evil.example\r\n", b"X: a\r\n Host: evil.example\r\n", b"no colon\r\n"):
        with pytest.raises(BadHost):
            parse_head(b"POST http://a.org/ HTTP/1.1\r\n" + head + b"\r\n")


@pytest.mark.parametrize("spelling", ["0x8.0x8.0x8.0x8", "0x08080808", "8.8.0x808", "8.8.2056", "0x7f.1", "a.0x"])
def test_an_ip_address_spelled_the_inet_aton_way_is_not_a_host_name(spelling: str) -> None:
    # getaddrinfo reads each as an address (8.8.8.8, 127.0.0.1), past the rules written for that address.
    with pytest.raises(BadHost):
        parse_head(f"CONNECT {spelling}:443 HTTP/1.1\r\n\r\n".encode())
    assert parse_head(b"CONNECT 0x8.example:443 HTTP/1.1\r\n\r\n").host == "0x8.example"


@pytest.mark.parametrize("address", ["64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::808:808", "::7f00:1",
                                     "::ffff:0:7f00:1", "fec0::1", "::ffff:0:a00:1"])
def test_an_ipv4_address_inside_an_ipv6_one_is_checked_as_itself_by_the_proxy_and_webhooks(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)), address
    assert targets.refusal(address), address
    assert refusal(ipaddress.ip_address("64:ff9b::808:808")) == "" and targets.refusal("64:ff9b::808:808") is None


def test_a_remembered_grant_or_rule_of_an_ipv6_host_matches_that_host_only() -> None:
    target = host_port("2001:db8::1", 443)  # unescaped, `[2001:db8::1]` is a character class: `d:443` matched
    request = {"toolArguments": {"host": target}, "network": {"host": "2001:db8::1", "port": 443}}
    call = CallRef("w", "a", "c", "call_1", "network", "{}")
    for scope in ("session", "always"):
        remembered = RuleBook._remembered(None, call, Decision("approve", scope), SYSTEM, "ap",  # type: ignore[arg-type]
                                          request)
        assert remembered is not None
        event = remembered[0]
        if scope == "session":
            grant = event["grant"]
            assert grant_applies(grant, "network", "a", "c", {"host": target})
            assert not grant_applies(grant, "network", "a", "c", {"host": "d:443"})
        else:
            rules = [{"rule": event["rule"]}]
            assert evaluate(NETWORK_TOOL, {"host": target}, agent="a", chat="c", rules=rules, grants=[]).verdict \
                == "allow"
            assert evaluate(NETWORK_TOOL, {"host": "b:443"}, agent="a", chat="c", rules=rules, grants=[]).verdict \
                == "ask"


def test_an_owners_rule_for_an_ipv6_host_is_read_with_its_brackets_as_brackets() -> None:
    exact = host_glob({"host": "[2001:db8::1]:443"})
    rule: dict[str, Any] = {"rule": {"id": "r", "tool": "network", "effect": "allow", "by": "owner", "match": exact}}
    prefix = {"rule": {**rule["rule"], "match": host_glob({"host": "[2001:db8:*]:443"})}}

    def verdict(host: str, *rules: dict[str, Any]) -> str:
        return evaluate(NETWORK_TOOL, {"host": host}, agent="a", chat="c", rules=list(rules), grants=[]).verdict

    assert verdict("[2001:db8::1]:443", rule) == "allow"
    assert verdict("d:443", rule) == verdict("1:443", rule) == "ask"
    assert (verdict("[2001:db8::7]:443", prefix), verdict("b:443", prefix)) == ("allow", "ask")
    assert host_glob(exact) == exact  # the page's escaped pattern stays as it is
    assert host_glob({"host": "[a-z]*.example:443"}) == {"host": "[a-z]*.example:443"}
