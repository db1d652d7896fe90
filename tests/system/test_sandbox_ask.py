"""The `ask` network mode (issue #33): a sandbox's only way out is its call's proxy, and each new
host:port is decided as a tool call is. In a network namespace of the test's own, against HTTP and
HTTPS servers on public-looking addresses inside it (tests/fixtures/netns.py)."""
from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, make_world, wait_until
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.netns import BIG, own_network, web_servers
from tests.fixtures.server import start_server

APPROVE = {"decision": "approve", "scope": "once"}


@pytest.fixture(scope="module")
def namespace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Entered before the function-scoped fixtures start their threads and processes (the LLM double,
    the server): they all live in it."""
    folder = tmp_path_factory.mktemp("netns")
    with own_network(), web_servers(folder):
        yield folder


@dataclass
class Ask:
    owner: httpx.Client
    llm: OpenAIDouble
    world: str

    def start(self, script: str, timeout: int = 60) -> None:
        """alice runs `python3 -c script` in the shell (the shell call approved once)."""
        command = f"python3 -c {shlex.quote(script)}"
        self.llm.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": command, "timeout": timeout}))))
        assert self.owner.post(f"/api/worlds/{self.world}/messages", json={"content": "go"}).status_code == 201
        shell = self.pending(lambda r: r["toolName"] == "shell_exec")
        self.decide(shell["id"], APPROVE)

    def pending(self, which: Any) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            for entry in self.owner.get(f"/api/worlds/{self.world}/approvals/pending").json():
                if which(entry["request"]):
                    return dict(entry)
            return None
        return wait_until(find, 30, what="a pending request")

    def asked(self, host: str) -> dict[str, Any]:
        return self.pending(lambda r: r["toolName"] == "network" and r["toolArguments"] == {"host": host})

    def decide(self, approval_id: str, content: dict[str, Any]) -> None:
        answer = self.owner.post(f"/api/worlds/{self.world}/tool-results",
                                 json={"role": "tool", "tool_call_id": approval_id, "content": json.dumps(content)})
        assert answer.status_code in (200, 201), answer.text

    def result(self, after: int) -> dict[str, Any]:
        def found() -> str | None:
            for request in self.llm.requests[after:]:
                if request.body["messages"][-1]["role"] == "tool":
                    return str(request.body["messages"][-1]["content"])
            return None
        parsed: dict[str, Any] = json.loads(wait_until(found, 90, what="the shell's result"))
        return parsed

    def connections(self) -> list[dict[str, Any]]:
        audit = self.owner.get(f"/api/worlds/{self.world}/audit", params={"limit": 1000}).json()
        return [e for e in audit if e["action"] == "network_connection"]


@pytest.fixture
def ask(namespace: Path, llm_double: OpenAIDouble, tmp_path: Path) -> Iterator[Ask]:
    server = start_server(tmp_path / "data", llm=llm_double)
    try:
        with client_for(server, server.token) as owner:
            world = make_world(owner, llm_double)
            changed = owner.patch(f"/api/worlds/{world}", json={"settings": {"sandbox_network": "ask"}})
            assert changed.status_code == 200 and changed.json()["settings"]["sandbox_network"] == "ask"
            yield Ask(owner, llm_double, world)
    finally:
        server.stop()


FETCH = ("import ssl, urllib.request\n"
         "def get(url):\n"
         "    try:\n"
         "        with urllib.request.urlopen(url, timeout=30, context=ssl._create_unverified_context()) as r:\n"
         "            body = r.read(); print('GOT', url, len(body), body[:40].decode())\n"
         "    except Exception as exc: print('FAILED', url, exc)\n")


def test_an_unlisted_host_asks_and_only_the_approved_host_port_goes_through(ask: Ask) -> None:
    before = len(ask.llm.requests)
    ask.start(FETCH + "get('http://1.2.3.4/'); get('https://1.2.3.4/')")
    first = ask.asked("1.2.3.4:80")
    assert "alice's `shell_exec` (in chat" in first["request"]["message"]
    assert "wants to reach 1.2.3.4:80" in first["request"]["message"]
    ask.decide(first["id"], APPROVE)
    # Approved for port 80 only: the same address's 443 asks again, and a denial says why.
    second = ask.asked("1.2.3.4:443")
    ask.decide(second["id"], {"decision": "deny", "scope": "once", "reason": "no TLS today"})
    output = ask.result(before)["output"]
    assert "GOT http://1.2.3.4/ 18 hello from 1.2.3.4" in output, output
    assert "FAILED https://1.2.3.4/" in output and "403 denied by owner: no TLS today" in output, output
    seen = {(c["host"], c["port"]): c for c in ask.connections()}
    assert seen[("1.2.3.4", 80)]["allowed"] and seen[("1.2.3.4", 80)]["received"] > 18, seen
    assert seen[("1.2.3.4", 80)]["approval_id"] == first["id"]
    assert not seen[("1.2.3.4", 443)]["allowed"] and "no TLS today" in seen[("1.2.3.4", 443)]["reason"]
    # Without the shell reaching anything but the proxy: no route out, no DNS.
    before = len(ask.llm.requests)
    ask.start("import socket\n"
              "for target in [('1.2.3.4', 80), ('8.8.8.8', 53)]:\n"
              "    try: socket.create_connection(target, 3); print('REACHED', target)\n"
              "    except OSError as exc: print('UNREACHED', target, exc)\n"
              "try: socket.getaddrinfo('tls.test', 443); print('RESOLVED')\n"
              "except OSError as exc: print('NO DNS', exc)\n")
    fenced = ask.result(before)["output"]
    assert "REACHED" not in fenced.replace("UNREACHED", "") and "NO DNS" in fenced, fenced


def test_rules_scopes_names_and_byte_caps_bound_what_goes_out(ask: Ask) -> None:
    owner, world = ask.owner, ask.world
    for match, effect in (("1.2.3.4:443", "allow"), ("localhost:*", "allow"), ("10.*", "allow"),
                          ("*.example:443", "deny")):
        added = owner.post(f"/api/worlds/{world}/rules",
                           json={"tool": "network", "match": {"host": match}, "effect": effect})
        assert added.status_code == 201, added.text
    caps = {"network_connection_bytes": 64 * 1024, "network_call_bytes": 100 * 1024}
    assert owner.patch(f"/api/worlds/{world}", json={"settings": {"sandbox_network": "ask", **caps}}).status_code == 200
    sni = ("import socket, ssl\n"
           "s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'CONNECT 1.2.3.4:443 HTTP/1.1\\r\\n\\r\\n')\n"
           "print('TUNNEL', s.recv(100).split(b'\\r\\n')[0].decode())\n"
           "try: ssl._create_unverified_context().wrap_socket(s, server_hostname='other.example'); print('SNI OK')\n"
           "except OSError as exc: print('SNI REFUSED', type(exc).__name__)\n"
           # Past NO_PROXY (which sends localhost to the sandbox's own loopback): straight to the proxy.
           "s = socket.create_connection(('127.0.0.1', 3128))\n"
           "s.sendall(b'GET http://localhost/ HTTP/1.1\\r\\n\\r\\n')\n"
           "print('LOCALHOST', s.recv(200).split(b'\\r\\n')[0].decode())\n")
    before = len(ask.llm.requests)
    ask.start(FETCH + sni + "get('https://1.2.3.4/'); get('http://10.1.2.3/');"
              " get('https://x.example/'); get('http://1.2.3.5/')")
    # 1.2.3.5:80 is in no rule: it asks; "this chat" lets the next call in this chat through unasked.
    asked = ask.asked("1.2.3.5:80")
    ask.decide(asked["id"], {"decision": "approve", "scope": "session"})
    output = ask.result(before)["output"]
    assert "GOT https://1.2.3.4/ 18 hello from 1.2.3.4" in output, output  # the rule, without anyone
    assert "TUNNEL HTTP/1.1 200" in output and "SNI REFUSED" in output, output
    # A name that resolves to a refused address (the hosts file's localhost) is refused, even when allowed.
    assert "LOCALHOST HTTP/1.1 403 localhost is refused: " in output and "is a loopback address" in output, output
    assert "10.1.2.3 is a private address" in output, output
    assert "denied by rule `host ~ *.example:443`" in output, output
    assert "GOT http://1.2.3.5/ 18 hello from 1.2.3.5" in output, output
    # The byte caps: one connection is cut at 64 KiB; the call's 100 KiB run out on the second.
    before = len(ask.llm.requests)
    ask.start(FETCH + "get('http://1.2.3.5/big'); get('http://1.2.3.5/big'); get('http://1.2.3.5/')")
    capped = ask.result(before)["output"]
    assert f"GOT http://1.2.3.5/big {BIG}" not in capped and "FAILED http://1.2.3.5/big" in capped, capped
    assert "network_call_bytes" in capped, capped  # the third connection is refused outright
    records = ask.connections()
    big = [c for c in records if c["host"] == "1.2.3.5" and c["received"] > 1000]
    assert big and all(c["sent"] + c["received"] <= 64 * 1024 for c in big), big
    assert any("network_connection_bytes" in c["reason"] for c in big), big
    hosts = {(c["host"], c["allowed"]) for c in records}
    assert {("1.2.3.4", True), ("localhost", False), ("10.1.2.3", False), ("x.example", False),
            ("1.2.3.5", True)} <= hosts, hosts
    sni_refused = [c for c in records if c["host"] == "1.2.3.4" and "TLS server name" in c["reason"]]
    assert sni_refused and "other.example" in sni_refused[0]["reason"], records
