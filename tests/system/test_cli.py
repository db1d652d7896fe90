"""`agent-world` on the command line: clear one-line failures, and the commands that work on a data folder."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx2 as httpx
import pytest

from server import vocab
from server.backends import open_backends
from server.engine.actors import Actor
from server.engine.engine import Engine
from tests.fixtures.api import sign_in
from tests.fixtures.cli import run_cli  # offline commands: in this process, no interpreter startup
from tests.fixtures.server import ROOT, ServerProcess, free_port, start_server


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {
        "AGENT_WORLD_TOKEN": "cli-test-token-of-at-least-32-characters"}
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command."""
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agent-world: error: ")
    return lines[0]


async def _make_worlds(data_dir: Path, *names: str) -> None:
    event_log, bus = await open_backends(data_dir=data_dir, redis_url=None)
    engine = Engine(event_log, bus, data_dir=data_dir)
    try:
        for name in names:
            await engine.create_world(Actor("owner", vocab.OWNER), name)
    finally:
        await engine.stop(grace=1)
        await bus.disconnect()
        await event_log.close()


def test_serve_on_a_taken_port_fails_with_one_line_naming_it(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        result = _cli("serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), "--no-demo")
    assert str(port) in _one_error_line(result)


def test_serve_with_an_unwritable_data_folder_fails_with_one_line(tmp_path: Path) -> None:
    regular_file = tmp_path / "a-file"
    regular_file.write_text("not a folder")
    result = _cli("serve", "--port", str(free_port()), "--data-dir", str(regular_file / "data"), "--no-demo")
    assert str(regular_file) in _one_error_line(result)


def test_serve_with_a_sandbox_uid_range_it_cannot_use_fails_with_one_line(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_WORLD_SANDBOX_UIDS", "1000-60000")  # login users' uids
    result = _cli("serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--no-demo")
    assert "AGENT_WORLD_SANDBOX_UIDS='1000-60000': START must be above 65535" in _one_error_line(result)


def test_serve_with_an_oauth_key_that_is_not_32_bytes_fails_with_one_line_saying_how_to_make_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_WORLD_MCP_OAUTH_KEY", "c2hvcnQ=")  # base64 of 5 bytes
    result = _cli("serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--no-demo")
    line = _one_error_line(result)
    assert "AGENT_WORLD_MCP_OAUTH_KEY must be 32 bytes in base64" in line and "os.urandom(32)" in line
    assert "c2hvcnQ=" not in line


def test_unreachable_or_malformed_redis_fails_with_one_line(tmp_path: Path) -> None:
    port = str(free_port())
    unreachable = _cli("serve", "--port", port, "--redis-url", "redis://127.0.0.1:1/0", "--no-demo")
    assert "127.0.0.1:1" in _one_error_line(unreachable)
    malformed = _cli("serve", "--port", port, "--redis-url", "http://127.0.0.1:6379", "--no-demo")
    assert "Redis URL" in _one_error_line(malformed)
    assert "127.0.0.1:1" in _one_error_line(run_cli("worlds", "--redis-url", "redis://127.0.0.1:1/0"))


def test_worlds_lists_the_worlds_of_a_data_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert "--data-dir" in _one_error_line(run_cli("worlds", "--data-dir", str(data)))
    assert not data.exists()  # a mistyped folder is not created
    asyncio.run(_make_worlds(data, "Alpha", "Beta Lab"))
    listed = run_cli("worlds", "--data-dir", str(data))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["alpha\tAlpha", "beta-lab\tBeta Lab"]
    as_json = run_cli("worlds", "--data-dir", str(data), "--json")
    assert json.loads(as_json.stdout) == [{"id": "alpha", "name": "Alpha"}, {"id": "beta-lab", "name": "Beta Lab"}]


def test_worlds_lists_a_page_at_a_time_with_a_limit_and_a_cursor(tmp_path: Path) -> None:
    data = tmp_path / "data"
    asyncio.run(_make_worlds(data, "Alpha", "Beta", "Gamma"))
    first = run_cli("worlds", "--data-dir", str(data), "--limit", "2")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["alpha\tAlpha", "beta\tBeta"]
    assert first.stderr.strip() == "more: agent-world worlds --limit 2 --cursor beta"
    last = run_cli("worlds", "--data-dir", str(data), "--limit", "2", "--cursor", "beta")
    assert (last.stdout.splitlines(), last.stderr) == (["gamma\tGamma"], "")
    assert "--cursor" in _one_error_line(run_cli("worlds", "--data-dir", str(data), "--cursor", "../x"))


def test_invite_prints_a_login_url_that_a_server_accepts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    asyncio.run(_make_worlds(data, "Alpha"))
    assert "no world 'nowhere'" in _one_error_line(run_cli("invite", "nowhere", "--role", "member",
                                                        "--data-dir", str(data)))
    made = run_cli("invite", "alpha", "--role", "member", "--name", "mia", "--data-dir", str(data),
                "--url", "http://example.test:9000")
    assert made.returncode == 0, made.stderr
    url = made.stdout.strip()
    assert url.startswith("http://example.test:9000/login?world=alpha&token=")
    token = parse_qs(urlsplit(url).query)["token"][0]
    server = start_server(data)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as browser:
            login = sign_in(browser, f"{server.url}/login?world=alpha&token={token}")
            assert login.status_code == 303 and login.headers["location"] == "/w/alpha"
            assert browser.get("/api/me").json() == {"name": "mia", "owner": False, "world": "alpha",
                                                     "role": "member"}
    finally:
        server.stop()


def test_ctrl_c_stops_serve_with_status_0_and_no_traceback(tmp_path: Path) -> None:
    """Ctrl+C is how a person stops `agent-world serve` in a terminal: a graceful stop, not a traceback."""
    server = start_server(tmp_path / "data")
    assert server.stop(signal.SIGINT) == 0
    log = server.log()
    assert "Application shutdown complete" in log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log


def test_a_second_embedded_server_on_the_same_folder_exits_with_one_line(server: ServerProcess) -> None:
    import subprocess
    import sys

    from tests.fixtures.server import ROOT, free_port

    result = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--port", str(free_port()),
                             "--data-dir", str(server.data_dir), "--no-demo"], cwd=ROOT, env=server.env,
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "another agent-world server is using the data folder" in lines[0]


@pytest.mark.parametrize("url", ["example.com", "http://", "https://:8443", "http://127.0.0.1:8680/agents",
                                 "http://127.0.0.1:8680?x=1", "http://127.0.0.1:8680#top", "http://host:port",
                                 "http://user:pw@example.com", "https://example.com ", "https://exa\tmple.com",
                                 "https://example.com\n/"])
def test_serve_with_a_public_url_that_is_not_an_origin_fails_with_one_line(tmp_path: Path, url: str) -> None:
    """Links are made by appending to the public URL: `http://` gave `http:/login?token=…`, a path gave
    links under a path the server does not serve, a query `http://h?x=1/login?token=…`."""
    result = _cli("serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--no-demo",
                  "--public-url", url)
    assert "--public-url" in _one_error_line(result)
    assert not (tmp_path / "data").exists()


def test_distributed_serve_without_an_owner_token_fails_with_one_line(tmp_path: Path) -> None:
    """Two replicas that each made up an owner token: behind a proxy without sticky sessions, the printed
    login link, the owner's session and the owner's bearer token worked on every other request."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "AGENT_WORLD_TOKEN")}
    result = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--port", str(free_port()), "--no-demo",
                             "--data-dir", str(tmp_path / "data"), "--redis-url", "redis://127.0.0.1:1/0"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert "AGENT_WORLD_TOKEN" in _one_error_line(result)
