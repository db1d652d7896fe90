"""The compose topology without Docker: Debian's nginx with deploy/nginx.conf in front of two
`agent-world serve` processes on one Redis (no sticky sessions), the OpenAI double, and a browser
that only ever talks to the proxy's URL."""
from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from playwright.sync_api import Browser, expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect  # sync: the module's Playwright keeps an event loop running

from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, client_for, wait_until
from tests.fixtures.api import sign_in as http_sign_in
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import tool_calls
from tests.fixtures.proxy import Nginx, start_nginx
from tests.fixtures.server import ROOT, ServerProcess, free_port, start_server
from tests.fixtures.storage import delete_prefix, unique_name

SCREENSHOTS = ROOT / "test-results" / "proxy"  # git-ignored
DECIDE = {"role": "tool", "content": json.dumps({"decision": "approve", "scope": "once"})}


@dataclass
class Topology:
    proxy: Nginx
    replicas: list[ServerProcess]
    front: ServerProcess  # the proxy's address, with the replicas' owner token: what people use
    llm: OpenAIDouble
    redis_url: str
    prefix: str


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Topology]:
    base = tmp_path_factory.mktemp("topology")
    prefix = unique_name("awproxy")
    proxy_port = free_port()
    public = f"http://127.0.0.1:{proxy_port}"
    args = ["--no-demo", "--redis-url", redis_url, "--redis-prefix", prefix, "--public-url", public,
            "--forwarded-allow-ips", "127.0.0.1"]  # the proxy, as FORWARDED_ALLOW_IPS in docker-compose.yml
    with OpenAIDouble() as llm:
        first = start_server(base / "data", llm=llm, args=args)  # one data folder for both, as one volume
        replicas = [first]
        proxy: Nginx | None = None
        try:
            replicas.append(start_server(base / "data", llm=llm, args=args, token=first.token))
            proxy = start_nginx(base / "nginx", [f"127.0.0.1:{r.port}" for r in replicas], proxy_port)
            front = replace(first, port=proxy_port, proc=None)
            yield Topology(proxy, replicas, front, llm, redis_url, prefix)
        finally:
            if proxy is not None:
                proxy.stop()
            for replica in replicas:
                replica.stop()
            delete_prefix(redis_url, prefix)


def _owner(topology: Topology) -> httpx.Client:
    return client_for(topology.front, topology.front.token)


def _world(topology: Topology, owner: httpx.Client, name: str) -> str:
    world = owner.post("/api/worlds", json={"name": f"{name} {unique_name('w')[-6:]}"})
    assert world.status_code == 201, world.text
    world_id: str = world.json()["id"]
    added = owner.post(f"/api/worlds/{world_id}/agents", json={
        "name": "alice", "system_prompt": "You are alice.", "provider": "openai", "model": "m",
        "base_url": topology.llm.base_url})
    assert added.status_code == 201, added.text
    return world_id


def _shell_then_reply(body: dict[str, Any]) -> Any:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Text(f"alice got {last['content'][:120]}")
    n = sum(1 for m in body["messages"] if m["role"] == "user")
    return tool_calls(("shell_exec", {"command": f"echo through-{n}"}))


def test_invite_links_and_agent_world_invite_name_the_public_url(topology: Topology) -> None:
    with _owner(topology) as owner:
        world = _world(topology, owner, "Links")
        made = owner.post(f"/api/worlds/{world}/invites", json={"role": "member", "name": "mia"})
        assert made.status_code == 201 and made.json()["url"].startswith(f"{topology.proxy.url}/login?world=")
        with httpx.Client(base_url=topology.proxy.url, timeout=10) as browser:  # the link works through the proxy
            assert http_sign_in(browser, made.json()["url"]).status_code == 303
            assert browser.get("/api/me").json()["name"] == "mia"
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WORLD_PUBLIC_URL", "AGENT_WORLD_URL", "REDIS_URL")}
    printed = subprocess.run([sys.executable, "-m", "server.cli", "invite", world, "--role", "spectator",
                              "--redis-url", topology.redis_url, "--redis-prefix", topology.prefix],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith(f"{topology.proxy.url}/login?world={world}&token=")  # not :8000


def test_websockets_pass_through_the_proxy_and_other_origins_are_refused(topology: Topology) -> None:
    with _owner(topology) as owner:
        world = _world(topology, owner, "Sockets")
    ws_url = f"ws://127.0.0.1:{topology.proxy.port}/api/worlds/{world}/ws"
    auth = {"Authorization": f"Bearer {topology.front.token}"}

    with connect(ws_url, additional_headers=auth | {"Origin": topology.proxy.url}, open_timeout=10) as ws:
        frames = [json.loads(ws.recv(10))]
        while frames[-1]["type"] != "snapshot":
            frames.append(json.loads(ws.recv(10)))
        assert frames[0]["event"]["kind"] == "world_created"
    with pytest.raises(InvalidStatus) as refused:
        with connect(ws_url, additional_headers=auth | {"Origin": "http://evil.test"}, open_timeout=10):
            pass
    assert refused.value.response.status_code == 403


def test_proxy_headers_are_believed_only_from_forwarded_allow_ips(topology: Topology, tmp_path: Path) -> None:
    """The replicas trust their proxy (loopback here) to say the browser came over https; a server
    whose --forwarded-allow-ips names someone else ignores the same header."""
    untrusting = start_server(tmp_path / "data", args=["--no-demo", "--forwarded-allow-ips", "10.9.9.9"])
    try:
        for server, secure in ((topology.replicas[1], True), (untrusting, False)):
            with httpx.Client(base_url=server.url, timeout=10, headers={"X-Forwarded-Proto": "https"}) as browser:
                query = {"token": server.token}
                assert browser.get("/login", params=query).status_code == 200
                origin = topology.proxy.url if server is not untrusting else untrusting.url
                answer = browser.post("/login", data=query, headers={"Origin": origin})
                assert answer.status_code == 303, answer.text
                assert ("; secure" in answer.headers["set-cookie"].lower()) is secure, answer.headers["set-cookie"]
    finally:
        untrusting.stop()


def _answered_through(owner: httpx.Client, world: str, n: int) -> bool:
    return any((e.get("content") or "").startswith("alice got") and f"through-{n}" in e["content"]
               for e in all_events(owner, world))


def test_a_decision_reaches_the_agent_whichever_replica_takes_it(topology: Topology) -> None:
    topology.llm.respond_with(_shell_then_reply)
    with _owner(topology) as owner:
        world = _world(topology, owner, "Either")
        for n, replica in enumerate(topology.replicas, start=1):
            assert owner.post(f"/api/worlds/{world}/messages", json={"content": f"go {n}"}).status_code == 201
            [approval] = wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(),
                                    what=f"approval {n}")
            with client_for(replica, replica.token) as direct:  # straight to one replica, not the proxy
                decided = direct.post(f"/api/worlds/{world}/tool-results",
                                      json={**DECIDE, "tool_call_id": approval["id"]})
            assert decided.status_code == 201, decided.text
            wait_until(functools.partial(_answered_through, owner, world, n), what=f"alice's answer after tool {n}")
    # One replica runs alice's turns (its lease), so one of the two decisions came through the other.


def test_a_browser_signs_in_through_the_proxy_and_approves(topology: Topology, chromium: Browser) -> None:
    topology.llm.respond_with(_shell_then_reply)
    setup = WorldSetup(topology.front, topology.llm, chromium)  # every URL it uses is the proxy's
    try:
        setup.make_world("alice")
        page = setup.open_page("member", "mia")  # invite link, login, world page, live WebSocket: all via nginx
        assert page.url.startswith(topology.proxy.url)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "signed-in.png"))
        setup.say("go")
        expect(page.locator("#approval-list > .approval")).to_have_count(1, timeout=10_000)
        page.locator("#queue-indicator").click()
        expect(page.locator("#approval-modal")).to_be_visible()
        page.screenshot(path=str(SCREENSHOTS / "approval.png"))
        page.keyboard.press("o")
        expect(page.locator("#log-main")).to_contain_text("alice got", timeout=10_000)
        expect(page.locator("#log-main")).to_contain_text("through-1")
        page.screenshot(path=str(SCREENSHOTS / "approved.png"))
    finally:
        setup.close()


def test_behind_a_tls_proxy_on_another_host_a_browser_websocket_is_accepted(tmp_path: Path) -> None:
    """What a TLS proxy for https://worlds.example.test sends: Host, X-Forwarded-Proto and the browser's Origin."""
    public = "https://worlds.example.test"
    server = start_server(tmp_path / "data", args=["--no-demo", "--public-url", public])
    proxied = {"Host": "worlds.example.test", "X-Forwarded-Proto": "https", "Origin": public}
    try:
        with httpx.Client(base_url=server.url, timeout=10, headers=proxied) as browser:
            world = browser.post("/api/worlds", json={"name": "Far"}, headers=server.headers)
            assert world.status_code == 201, world.text
            assert browser.get("/login", params={"token": server.token}).status_code == 200
            login = browser.post("/login", data={"token": server.token})
            assert login.status_code == 303 and login.headers["set-cookie"].startswith("__Host-aw_session=")
            cookie = login.headers["set-cookie"].split(";")[0]

        url = f"ws://worlds.example.test/api/worlds/{world.json()['id']}/ws"  # Host as the proxy passes it
        headers = {"X-Forwarded-Proto": "https", "Origin": public, "Cookie": cookie}
        with connect(url, additional_headers=headers, open_timeout=10,
                     sock=socket.create_connection(("127.0.0.1", server.port), timeout=10)) as ws:
            while json.loads(ws.recv(10))["type"] != "snapshot":
                pass
    finally:
        server.stop()
