"""Issue #10, sessions and requests: each finding reproduced against a real `agent-world serve`."""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
import redis
from itsdangerous import BadSignature, URLSafeTimedSerializer
from playwright.sync_api import Browser
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as sync_connect

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, error_of, invite, make_world, sign_in, wait_until
from tests.fixtures.browser import sign_in as browser_sign_in
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.server import ROOT, ServerProcess, free_port, start_server
from tests.fixtures.static_http import static_http
from tests.fixtures.storage import delete_prefix, unique_name
from tests.fixtures.ws import read_until, ws_connect

APPROVE = json.dumps({"decision": "approve", "scope": "once"})


@contextlib.contextmanager
def _signed_in(server: ServerProcess, login_url: str) -> Iterator[httpx.Client]:
    """A browser-like client that opened `login_url` and confirmed."""
    with httpx.Client(base_url=server.url, timeout=10) as browser:
        assert sign_in(browser, login_url).status_code == 303
        yield browser


def _owner_login(server: ServerProcess) -> str:
    return f"{server.url}/login?token={server.token}"


@contextlib.contextmanager
def _started(*args: object, **kwargs: object) -> Iterator[ServerProcess]:
    process = start_server(*args, **kwargs)  # type: ignore[arg-type]
    try:
        yield process
    finally:
        process.stop()


# -- finding 3: the session cookie goes to every port on the host ---------------------------
async def test_a_session_cookie_works_nowhere_but_where_it_was_issued(tmp_path: Path) -> None:
    """A browser sends one host's cookies to every port: another server there, same owner token, gets nothing."""
    token = "same-owner-token-on-both-servers-0123456789"
    with _started(tmp_path / "a", token=token) as first, _started(tmp_path / "b", token=token) as second:
        with _signed_in(first, _owner_login(first)) as browser:
            assert browser.get("/api/me").json()["owner"] is True
            cookie = dict(browser.cookies)
            other_port = httpx.get(f"{second.url}/api/me", cookies=cookie)
            assert other_port.status_code == 401 and error_of(other_port) == "unauthorized"
            # a page on another port of this host, using the cookie through the browser: refused too
            foreign = {"Origin": second.url}
            posted = browser.post("/api/worlds", json={"name": "x"}, headers=foreign)
            assert posted.status_code == 403 and error_of(posted) == "forbidden"
            with pytest.raises(InvalidStatus) as refused:
                async with connect(f"{first.ws_url}/api/worlds/x/ws", additional_headers={
                        **foreign, "Cookie": "; ".join(f"{k}={v}" for k, v in cookie.items())}):
                    pass
            assert refused.value.response.status_code == 403


def test_behind_https_the_cookie_is_host_only_secure_and_prefixed(tmp_path: Path) -> None:
    with _started(tmp_path / "data", args=["--no-demo", "--public-url", "https://aw.example.test"]) as server:
        with httpx.Client(base_url=server.url, timeout=10) as browser:
            page = browser.get("/login", params={"token": server.token})
            assert page.status_code == 200
            login = browser.post("/login", data={"token": server.token}, headers={"Origin": "https://aw.example.test"})
            assert login.status_code == 303
            attributes = [part.strip().lower() for part in login.headers["set-cookie"].split(";")]
            assert attributes[0].startswith("__host-aw_session=")
            assert {"secure", "httponly", "path=/", "samesite=lax"} <= set(attributes)
            assert not any(a.startswith("domain=") for a in attributes)


# -- finding 4: login CSRF, logout, the cookie key, short owner tokens ---------------------------
def test_opening_a_login_link_switches_no_session(server: ServerProcess, owner: httpx.Client,
                                                  llm_double: OpenAIDouble) -> None:
    """A foreign page can make a browser open any login link: that must only show a question."""
    world = make_world(owner, llm_double, agents=())
    mine, attackers = invite(owner, world, "member", "maria"), invite(owner, world, "spectator", "eve")
    with _signed_in(server, mine["url"]) as browser:
        shown = browser.get(attackers["url"])
        assert shown.status_code == 200 and "set-cookie" not in shown.headers
        assert "spectator" in shown.text and "eve" in shown.text and 'method="post"' in shown.text
        assert shown.headers["referrer-policy"] == "same-origin" and shown.headers["cache-control"] == "no-store"
        assert browser.get(_owner_login(server)).status_code == 200
        assert browser.get("/api/me").json()["name"] == "maria"
        forged = browser.post("/login", data={"token": attackers["token"], "world": world},
                              headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403 and "set-cookie" not in forged.headers
        assert browser.get("/api/me").json()["name"] == "maria"


def test_logging_out_ends_the_session_on_the_server(server: ServerProcess) -> None:
    with _signed_in(server, _owner_login(server)) as browser:
        captured = dict(browser.cookies)
        assert browser.post("/logout", headers={"Origin": server.url}).status_code == 200
    replayed = httpx.get(f"{server.url}/api/me", cookies=captured)
    assert replayed.status_code == 401 and error_of(replayed) == "unauthorized"


def test_a_session_cookie_cannot_test_owner_token_guesses(server: ServerProcess, owner: httpx.Client,
                                                          llm_double: OpenAIDouble) -> None:
    """The cookie used to be signed with a key derived from the owner token: an offline oracle for guesses."""
    world = make_world(owner, llm_double, agents=())
    with _signed_in(server, invite(owner, world, "member")["url"]) as member:
        cookie = member.cookies["aw_session"]
    for guess in ("wrong-guess", server.token):  # even the right guess must not verify
        key = hmac.new(guess.encode(), b"agent-world/session-cookie/v1", hashlib.sha256).hexdigest()
        with pytest.raises(BadSignature):
            URLSafeTimedSerializer(key, salt="aw-session").loads(cookie)


def test_serve_refuses_an_owner_token_under_32_characters(tmp_path: Path) -> None:
    env = {**os.environ, "AGENT_WORLD_TOKEN": "x"}
    result = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--port", str(free_port()),
                             "--data-dir", str(tmp_path / "data"), "--no-demo"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "at least 32" in lines[0], result.stderr


def test_wrong_tokens_from_one_address_are_rate_limited(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as guesser:
        answers = [guesser.get("/api/worlds", headers={"Authorization": f"Bearer guess-{n}"}) for n in range(40)]
        assert {a.status_code for a in answers[:30]} == {401}
        limited = answers[-1]
        assert limited.status_code == 429 and error_of(limited) == "too_many_requests"
        assert 1 <= int(limited.headers["retry-after"]) <= 60
        # while limited, even the right token is not checked: a guess cannot be confirmed
        assert guesser.get("/api/worlds", headers={"Authorization": f"Bearer {server.token}"}).status_code == 429
        login = guesser.get("/login", params={"token": server.token})
        assert login.status_code == 429
        with pytest.raises(InvalidStatus) as refused:
            sync_connect(f"{server.ws_url}/api/worlds/any/ws",
                         additional_headers={"Authorization": f"Bearer {server.token}"}).close()
        assert refused.value.response.status_code == 429 and refused.value.response.headers["Retry-After"]
        time.sleep(int(login.headers["retry-after"]) + 0.2)  # then one more try is allowed
        assert guesser.get("/api/worlds", headers={"Authorization": f"Bearer {server.token}"}).status_code == 200


# -- finding 5: pages can be framed ----------------------------------------------------------
def test_every_response_forbids_framing_and_inline_code(server: ServerProcess, owner: httpx.Client,
                                                        llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    with _signed_in(server, _owner_login(server)) as browser:
        answers = [browser.get("/"), browser.get(f"/w/{world}"), browser.get(f"/w/{world}/audit"),
                   browser.get("/static/app.js"), browser.get("/no-such-page"), browser.get("/api/worlds"),
                   browser.get("/login", params={"token": server.token}), browser.get("/healthz"),
                   httpx.get(f"{server.url}/api/worlds")]
    for answer in answers:
        csp = answer.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, answer.url
        assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
        assert answer.headers.get("x-frame-options") == "DENY", answer.url
        assert answer.headers.get("x-content-type-options") == "nosniff", answer.url
        assert answer.headers.get("referrer-policy") in ("same-origin", "no-referrer"), answer.url
    assert answers[1].status_code == 200 and "<script>" not in answers[1].text and " style=" not in answers[1].text


# -- finding 6: unauthenticated memory and disk exhaustion -------------------------------------
def _answer_to_a_partial_body(server: ServerProcess, path: str, declared: int, sent: bytes) -> tuple[int, bytes]:
    """Send headers promising `declared` bytes of form, then only `sent`: the (status, body) answered meanwhile.

    (0, b"") when the server waits for the rest of the body instead of answering.
    """
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                      f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {declared}\r\n\r\n"
                      ).encode() + sent)
        sock.settimeout(5)
        answer = b""
        with contextlib.suppress(TimeoutError):
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
                    answer.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
    if not answer:
        return 0, b""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_page_forms_refuse_strangers_before_reading_the_body(server: ServerProcess, owner: httpx.Client,
                                                             llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    for path in ("/worlds", f"/w/{world}/agents", f"/w/{world}/chats", f"/w/{world}/models"):
        status, _ = _answer_to_a_partial_body(server, path, 900_000, b"name=" + b"a" * 100)
        assert status == 403, path
    status, body = _answer_to_a_partial_body(server, f"/w/{world}/invites", 900_000, b"role=member&name=")
    assert status == 200 and b'class="error"' in body  # the invite form answers htmx with its error text


def test_every_request_body_is_capped_while_it_streams(server: ServerProcess) -> None:
    def chunks(total: int, first: bytes) -> Iterator[bytes]:  # no Content-Length: chunked transfer
        yield first
        for _ in range(total // 65536):
            yield b"a" * 65536

    with _signed_in(server, _owner_login(server)) as browser:
        origin = {"Origin": server.url}
        form = browser.post("/worlds", content=chunks(3 << 20, b"name="),
                            headers={**origin, "Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 413 and error_of(form) == "too_large"
        declared = browser.post("/worlds", content=b"name=" + b"a" * (2 << 20),
                                headers={**origin, "Content-Type": "application/x-www-form-urlencoded"})
        assert declared.status_code == 413
        multipart = browser.post("/worlds", files={"upload": ("big.bin", b"x" * 1000)}, data={"name": "y"},
                                 headers=origin)
        assert multipart.status_code == 415  # never spooled to disk
        api = browser.post("/api/worlds", content=chunks(3 << 20, b'{"name": "'),
                           headers={**origin, "Content-Type": "application/json"})
        assert api.status_code == 413 and error_of(api) == "too_large"
        assert browser.get("/api/worlds").json() == []  # nothing was made


# -- finding 7: a random bearer token looked up in every world; deep JSON ----------------------
@contextlib.contextmanager
def _redis_commands(url: str, needle: str) -> Iterator[list[str]]:
    """The Redis commands containing `needle` that clients sent while the block runs (Redis MONITOR; not
    the commands a script ran, which it shows too: one lookup is one EVALSHA)."""
    seen: list[str] = []
    ready = threading.Event()
    end = f"monitor-end-{uuid.uuid4().hex}"

    def watch() -> None:
        with redis.Redis.from_url(url).monitor() as monitor:  # type: ignore[no-untyped-call]  # untyped in redis-py
            ready.set()
            while True:
                info = monitor.next_command()
                command = info["command"]
                if end in command:
                    return
                if needle in command and info.get("client_type") != "lua":
                    seen.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield seen
    finally:
        with redis.Redis.from_url(url) as client:
            client.get(end)
        thread.join(10)


@pytest.fixture
def redis_server(tmp_path: Path, redis_url: str, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    """A server in the distributed mode, on its own prefix of the test Redis."""
    prefix = unique_name("awsec")
    process = start_server(tmp_path / "data", llm=llm_double,
                           args=["--no-demo", "--redis-url", redis_url, "--redis-prefix", prefix])
    try:
        yield process
    finally:
        process.stop()
        delete_prefix(redis_url, prefix)


def test_a_bearer_token_is_looked_up_in_one_world_at_most(redis_server: ServerProcess, redis_url: str,
                                                          llm_double: OpenAIDouble) -> None:
    with client_for(redis_server, redis_server.token) as owner:
        worlds = [make_world(owner, llm_double, name=f"World {n}", agents=()) for n in range(20)]
        member = invite(owner, worlds[7], "member", "mia")
    with _redis_commands(redis_url, "invite:") as lookups:
        stranger = httpx.get(f"{redis_server.url}/api/worlds", headers={"Authorization": "Bearer " + "z" * 40})
        assert stranger.status_code == 401
    assert lookups == []
    with _redis_commands(redis_url, "invite:") as lookups:
        known = httpx.get(f"{redis_server.url}/api/worlds", headers={"Authorization": f"Bearer {member['token']}"})
        assert [w["id"] for w in known.json()] == [worlds[7]]
    assert len(lookups) == 1, lookups


def _pending_approval(owner: httpx.Client, llm_double: OpenAIDouble) -> tuple[str, dict[str, object]]:
    """A new world whose agent waits for the approval of `shell_exec("true")`: the world and that approval."""
    world = make_world(owner, llm_double)
    llm_double.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": "true"}))))
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": "run it"}).status_code == 201
    return world, wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(), what="approval")[0]


def test_deeply_nested_json_is_a_400_not_a_500(server: ServerProcess, owner: httpx.Client,
                                               llm_double: OpenAIDouble) -> None:
    world, approval = _pending_approval(owner, llm_double)
    for content in ("[" * 100_000, json.dumps({"decision": "approve", "scope": "once", "reason": "x",
                                              "match": json.loads("[" * 200 + "]" * 200)})):
        decided = owner.post(f"/api/worlds/{world}/tool-results",
                             json={"role": "tool", "tool_call_id": approval["id"], "content": content})
        assert decided.status_code == 400 and error_of(decided) == "invalid", decided.text
    deep_body = '{"content": "hi", "chat": ' + "[" * 500 + "]" * 500 + "}"
    posted = owner.post(f"/api/worlds/{world}/messages", content=deep_body,
                        headers={"Content-Type": "application/json"})
    assert posted.status_code == 400 and error_of(posted) == "invalid"
    assert owner.get(f"/api/worlds/{world}/approvals/pending").json()[0]["id"] == approval["id"]


# -- finding 8: operations leaks ----------------------------------------------------------------
def test_metrics_need_the_owner_or_the_metrics_token(server: ServerProcess, owner: httpx.Client, tmp_path: Path,
                                                     llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    anonymous = httpx.get(f"{server.url}/metrics")
    assert anonymous.status_code == 401 and world not in anonymous.text
    member_token = invite(owner, world, "member")["token"]
    as_member = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {member_token}"})
    assert as_member.status_code == 403 and world not in as_member.text
    assert owner.get("/metrics").status_code == 200
    metrics_token = "metrics-token-for-the-scraper-0123456789"
    with _started(tmp_path / "other", args=["--no-demo", "--metrics-token", metrics_token]) as scraped:
        scraper = httpx.get(f"{scraped.url}/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert scraper.status_code == 200 and "agent_world_connections" in scraper.text
        assert httpx.get(f"{scraped.url}/metrics", headers={"Authorization": "Bearer " + "x" * 40}).status_code == 401


def test_a_metrics_scrape_reads_no_world_and_counts_pending_approvals(
        redis_server: ServerProcess, redis_url: str, llm_double: OpenAIDouble) -> None:
    with client_for(redis_server, redis_server.token) as owner:
        world = make_world(owner, llm_double)
        worlds = [world, *(make_world(owner, llm_double, name=f"Idle {n}", agents=()) for n in range(5))]
        llm_double.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": "true"}))))
        assert owner.post(f"/api/worlds/{world}/messages", json={"content": "run it"}).status_code == 201
        approval = wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(), what="approval")[0]
        gauge = f'agent_world_pending_approvals{{world="{world}"}}'
        with _redis_commands(redis_url, "approval:") as reads:
            scrape = owner.get("/metrics").text
        assert f"{gauge} 1.0" in scrape
        # (the module's server hosts other tests' worlds too, whose own work may read their requests meanwhile)
        assert [read for read in reads if any(f":{w}}}" in read for w in worlds)] == []
        decided = owner.post(f"/api/worlds/{world}/tool-results",
                             json={"role": "tool", "tool_call_id": approval["id"], "content": APPROVE})
        assert decided.status_code == 201
        wait_until(lambda: f"{gauge} 0.0" in owner.get("/metrics").text, what="the gauge to drop")


def test_healthz_reports_the_log_and_the_bus_and_503_when_redis_is_down(tmp_path: Path) -> None:
    port = free_port()
    redis_proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        wait_until(lambda: _pings(url), what="the private Redis")
        with _started(tmp_path / "data", args=["--no-demo", "--redis-url", url]) as server:
            healthy = httpx.get(f"{server.url}/healthz")
            assert healthy.status_code == 200
            body = healthy.json()
            assert body["status"] == "ok" and body["log"].startswith("ok") and body["bus"].startswith("ok")
            redis_proc.terminate()
            redis_proc.wait(10)
            down = httpx.get(f"{server.url}/healthz", timeout=15)
            assert down.status_code == 503
            body = down.json()
            assert body["status"] == "down" and body["log"].startswith("down") and body["bus"].startswith("down")
    finally:
        redis_proc.kill()
        redis_proc.wait(10)


def _pings(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def test_the_data_folder_and_its_files_are_private(server: ServerProcess, owner: httpx.Client) -> None:
    with _signed_in(server, _owner_login(server)):
        pass  # a session is stored too
    assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
    files = [p for p in server.data_dir.iterdir() if p.is_file()]
    assert {p.name for p in files} >= {"agent-world.sqlite3", "session.key", "sessions.sqlite3"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_sessions_are_shared_by_every_process_of_a_deployment(tmp_path: Path, redis_url: str) -> None:
    """Behind one public address, a session made through one process works through another, and ends everywhere."""
    prefix = unique_name("awsec")
    args = ["--no-demo", "--redis-url", redis_url, "--redis-prefix", prefix]
    token = "one-owner-token-for-the-deployment-0123456789"
    try:
        with _started(tmp_path / "a", args=args, token=token) as first, \
                _started(tmp_path / "b", args=args, token=token) as second:
            with _signed_in(first, _owner_login(first)) as browser:
                same_address = {"Host": f"127.0.0.1:{first.port}"}  # what a proxy in front of both would send
                cookie = dict(browser.cookies)
                through_second = httpx.get(f"{second.url}/api/me", cookies=cookie, headers=same_address)
                assert through_second.status_code == 200 and through_second.json()["owner"] is True
                ended = httpx.post(f"{second.url}/logout", cookies=cookie, headers=same_address)
                assert ended.status_code == 200
                assert browser.get("/api/me").status_code == 401
    finally:
        delete_prefix(redis_url, prefix)  # sessions and their secret included


def test_a_lone_surrogate_is_a_400_everywhere_and_writes_nothing(server: ServerProcess, owner: httpx.Client,
                                                                  llm_double: OpenAIDouble) -> None:
    """`"\\ud800"` parses as JSON but is not Unicode: storing it failed with a plain-text 500."""
    world, approval = _pending_approval(owner, llm_double)
    before = owner.get(f"/api/worlds/{world}/events").json()
    decision = '{"decision": "approve", "scope": "once", "reason": "\\ud800"}'
    for path, body in ((f"/api/worlds/{world}/messages", '{"content": "\\ud800"}'),
                       ("/api/worlds", '{"name": "\\udfff world"}'),
                       (f"/api/worlds/{world}/tool-results", json.dumps(
                           {"role": "tool", "tool_call_id": approval["id"], "content": decision}))):
        answered = owner.post(path, content=body, headers={"Content-Type": "application/json"})
        assert answered.status_code == 400 and error_of(answered) == "invalid", (path, answered.text)
        assert "surrogate" in answered.json()["error"]["message"]
    assert owner.get(f"/api/worlds/{world}/events").json() == before
    assert owner.get(f"/api/worlds/{world}/approvals/pending").json()[0]["id"] == approval["id"]


def test_an_approval_timeout_past_thirty_days_is_refused(owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    """A timeout of 1e300 s was taken, and then every request for approval failed on its deadline."""
    world = make_world(owner, llm_double)
    for timeout in (1e300, 30 * 86400 + 1):
        changed = owner.patch(f"/api/worlds/{world}", json={"settings": {"approval_timeout": timeout}})
        assert changed.status_code == 400 and "approval_timeout" in changed.text
    assert owner.patch(f"/api/worlds/{world}", json={"settings": {"approval_timeout": 30 * 86400}}).status_code == 200


async def test_a_deeply_nested_websocket_frame_gets_an_error_and_the_socket_stays(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    async with ws_connect(server, world, server.token) as ws:
        await read_until(ws, lambda f: f["type"] == "snapshot")
        deep = json.loads("[" * 300 + "]" * 300)
        await ws.send(json.dumps({"type": "say", "content": "x", "chat": deep, "ref": 1}))
        error = (await read_until(ws, lambda f: f["type"] == "error"))[-1]
        assert error["code"] == "invalid" and "levels deep" in error["message"]
        await ws.send('{"type": "say", "content": "\\ud800", "ref": 2}')
        error = (await read_until(ws, lambda f: f["type"] == "error"))[-1]
        assert error["code"] == "invalid" and "surrogate" in error["message"], error
        await ws.send(json.dumps({"type": "resync"}))
        await read_until(ws, lambda f: f["type"] == "snapshot")


@contextlib.contextmanager
def _page_on_another_port(html: str) -> Iterator[str]:
    """A plain HTTP server on another port of this host, serving `html` at `/`: a foreign origin, same site."""
    with static_http(html.encode(), "text/html") as (origin, _):
        yield f"{origin}/"


def test_a_page_on_another_port_cannot_frame_a_world(server: ServerProcess, owner: httpx.Client,
                                                     llm_double: OpenAIDouble, chromium: Browser) -> None:
    world = make_world(owner, llm_double, agents=())
    context = chromium.new_context()
    try:
        page = context.new_page()
        browser_sign_in(page, _owner_login(server))
        page.goto(f"{server.url}/w/{world}")
        page.wait_for_selector("#connection[data-state=live]", timeout=10_000)  # signed in, the page works
        with _page_on_another_port(f'<iframe id="victim" src="{server.url}/w/{world}"></iframe>') as foreign:
            page.goto(foreign)
            page.wait_for_load_state("load")
            page.wait_for_timeout(1000)
            framed = page.frames[1]
            assert framed.url.startswith("chrome-error:"), framed.url  # refused by frame-ancestors / X-Frame-Options
            assert all(frame.query_selector("#connection") is None for frame in page.frames)
    finally:
        context.close()
