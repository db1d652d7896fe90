"""The owner token outlives restarts: `serve` makes it once, keeps it 0600 in the data folder and reuses
it, so the printed login link and the owner's sessions stay valid; `AGENT_WORLD_TOKEN` wins (docs/deployment.md)."""
from __future__ import annotations

import stat
from pathlib import Path

import httpx2 as httpx

from tests.fixtures.api import client_for, invite, sign_in
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.storage import delete_prefix, unique_name


def _printed_link(server: ServerProcess) -> str:
    opens = [line.removeprefix("Open: ") for line in server.log().splitlines() if line.startswith("Open: ")]
    assert len(opens) == 1, server.log()
    return opens[0]


def test_serve_makes_the_owner_token_once_keeps_it_0600_and_reuses_it(tmp_path: Path) -> None:
    """Found by a user: each start of `./dev serve` made a new token, so a restart ended the owner's
    session and the link printed before was "not valid"."""
    server = start_server(tmp_path / "data", kept_token=True)
    try:
        kept = tmp_path / "data" / "owner.token"
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        token = kept.read_text().strip()
        assert len(token) >= 32
        first_link = _printed_link(server)
        assert first_link == f"{server.url}/login?token={token}"
        assert "kept in" in server.log()  # said once, when it is made
        with httpx.Client(base_url=server.url, timeout=10) as browser:
            assert sign_in(browser, first_link).status_code == 303
            made = kept.stat()
            server.restart()
            assert _printed_link(server) == first_link and "kept in" not in server.log()
            assert kept.read_text().strip() == token and kept.stat().st_ino == made.st_ino
            me = browser.get("/api/me")
            assert me.status_code == 200 and me.json()["owner"] is True  # the session outlived the restart
            assert browser.get("/login", params={"token": token}).status_code == 200  # the old link too
    finally:
        server.stop()


def test_agent_world_token_wins_over_the_kept_owner_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    start_server(data_dir, kept_token=True).stop()
    kept = (data_dir / "owner.token").read_text().strip()
    server = start_server(data_dir)  # with AGENT_WORLD_TOKEN
    try:
        assert server.token != kept
        with client_for(server, kept) as with_kept:
            assert with_kept.get("/api/me").status_code == 401
        with client_for(server, server.token) as owner:
            assert owner.get("/api/me").json()["owner"] is True
        assert "/login?token=" not in server.log()  # no link with the environment's token printed
        assert (data_dir / "owner.token").read_text().strip() == kept  # left as it was
    finally:
        server.stop()


def test_sessions_outlive_a_restart_in_distributed_mode(tmp_path: Path, redis_url: str) -> None:
    """With Redis every replica shares AGENT_WORLD_TOKEN (required there) and the session store."""
    prefix = unique_name()
    server = start_server(tmp_path / "data", args=["--no-demo", "--redis-url", redis_url, "--redis-prefix", prefix])
    try:
        with client_for(server, server.token) as owner, httpx.Client(base_url=server.url, timeout=10) as as_owner, \
                httpx.Client(base_url=server.url, timeout=10) as as_member:
            world = owner.post("/api/worlds", json={"name": "Team"}).json()["id"]
            assert sign_in(as_owner, f"{server.url}/login?token={server.token}").status_code == 303
            assert sign_in(as_member, invite(owner, world, "member", "mia")["url"]).status_code == 303
            server.restart()
            assert as_owner.get("/api/me").json()["owner"] is True
            assert as_member.get("/api/me").json()["name"] == "mia"
    finally:
        server.stop()
        delete_prefix(redis_url, prefix)
