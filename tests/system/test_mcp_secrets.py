"""MCP server secrets stay with the server (issue #10, finding 2): `env` values and secret-looking `args`
are stored and used, and no client — member, spectator, or the owner — ever reads them back."""
from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx

from server.testing.openai_double import OpenAIDouble
from server.tools.mcp.masking import masked_args, secret_args
from tests.fixtures.api import client_for, invite, make_world, wait_until
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.tools import ECHO_SERVER
from tests.fixtures.ws import read_until, replay_and_snapshot, ws_connect

MASK = "•••"
GITHUB_TOKEN = "ghp_" + secrets.token_hex(18)
ARG_KEY = "sk-arg-" + secrets.token_hex(16)
ARG_TOKEN = secrets.token_hex(20)
SECRETS = (GITHUB_TOKEN, ARG_KEY, ARG_TOKEN)


def _server_settings(env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"mcp_servers": [{"name": "echo", "command": sys.executable,
                             "args": [ECHO_SERVER, "--api-key", ARG_KEY, f"--token={ARG_TOKEN}", "--verbose"],
                             "env": env if env is not None else {"GITHUB_TOKEN": GITHUB_TOKEN},
                             # untrusted: only the owner's word lets a tool run without asking
                             "tools": {"getenv": {"approval": "never"}, "getenv_sha256": {"approval": "never"}}}]}


def _world_with_secrets(owner: httpx.Client, llm: OpenAIDouble) -> str:
    world = make_world(owner, llm)
    changed = owner.patch(f"/api/worlds/{world}", json={"settings": _server_settings()})
    assert changed.status_code == 200, changed.text
    return world


def _assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows a secret"


def _getenv(owner: httpx.Client, llm: OpenAIDouble, world: str, name: str, tool: str = "getenv") -> str:
    """What the world's MCP server reads from its environment (as the LLM receives the tool's result)."""
    before = len(llm.requests)
    llm.respond_with(reply_by_turn(tool_calls((f"echo__{tool}", {"name": name}))))
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": "read it"}).status_code == 201

    def result() -> str | None:
        for request in llm.requests[before:]:
            if request.body["messages"][-1]["role"] == "tool":
                content: str = request.body["messages"][-1]["content"]
                return content
        return None
    return wait_until(result, 20, what="the getenv result")


def test_mcp_env_and_secret_args_reach_no_client(server: ServerProcess, llm_double: OpenAIDouble) -> None:
    with client_for(server, server.token) as owner:
        world = _world_with_secrets(owner, llm_double)
        member = invite(owner, world, "member", name="max")["token"]
        spectator = invite(owner, world, "spectator", name="sam")["token"]
        for token, who in ((server.token, "owner"), (member, "member"), (spectator, "spectator")):
            with client_for(server, token) as client:
                info = client.get(f"/api/worlds/{world}")
                assert info.status_code == 200, info.text
                _assert_no_secret(info.text, f"GET /api/worlds/{{w}} as {who}")
                [shown] = info.json()["settings"]["mcp_servers"]
                assert shown["env"] == {"GITHUB_TOKEN": MASK}
                assert shown["args"] == [ECHO_SERVER, "--api-key", MASK, f"--token={MASK}", "--verbose"]
                events = client.get(f"/api/worlds/{world}/events", params={"after": 0})
                assert events.status_code == 200
                _assert_no_secret(events.text, f"/events as {who}")

        async def over_the_websocket(token: str) -> str:
            async with ws_connect(server, world, token, after=0) as ws:
                events, snapshot, others = await replay_and_snapshot(ws)
                return json.dumps([events, snapshot, others])
        for token, who in ((member, "member"), (spectator, "spectator")):
            _assert_no_secret(asyncio.run(over_the_websocket(token)), f"the JSON WebSocket as {who}")
        # The page of the world, as a spectator would see it.
        page = httpx.get(f"{server.url}/w/{world}", headers={"Authorization": f"Bearer {spectator}"})
        assert page.status_code == 200 and "Lab" in page.text, page.status_code
        _assert_no_secret(page.text, "the world's page")

        # …and the server does use them, while the LLM never reads one a server echoes.
        assert _getenv(owner, llm_double, world, "GITHUB_TOKEN", "getenv_sha256") == _sha256(GITHUB_TOKEN)
        assert _getenv(owner, llm_double, world, "GITHUB_TOKEN") == "[redacted]"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_owner_can_edit_a_server_without_resending_its_secrets(server: ServerProcess,
                                                                   llm_double: OpenAIDouble) -> None:
    with client_for(server, server.token) as owner:
        world = _world_with_secrets(owner, llm_double)
        [shown] = owner.get(f"/api/worlds/{world}").json()["settings"]["mcp_servers"]
        # Sent back as shown, with one more variable: the masked values keep what is stored.
        edited = {**shown, "env": {**shown["env"], "EXTRA": "1"}}
        changed = owner.patch(f"/api/worlds/{world}", json={"settings": {"mcp_servers": [edited]}})
        assert changed.status_code == 200, changed.text
        _assert_no_secret(changed.text, "the PATCH answer")
        assert changed.json()["settings"]["mcp_servers"][0]["env"] == {"GITHUB_TOKEN": MASK, "EXTRA": MASK}
        assert _getenv(owner, llm_double, world, "EXTRA") == "1"  # restarted with the new environment
        assert _getenv(owner, llm_double, world, "GITHUB_TOKEN", "getenv_sha256") == _sha256(GITHUB_TOKEN)
        # A mask that stands for nothing stored is refused, not stored as the value.
        unknown = {**shown, "env": {"NEW_TOKEN": MASK}}
        refused = owner.patch(f"/api/worlds/{world}", json={"settings": {"mcp_servers": [unknown]}})
        assert refused.status_code == 400 and "NEW_TOKEN" in refused.json()["error"]["message"]
        # Replacing a value works as before.
        replaced = owner.patch(f"/api/worlds/{world}",
                               json={"settings": _server_settings({"GITHUB_TOKEN": "ghp_replaced"})})
        assert replaced.status_code == 200
        assert _getenv(owner, llm_double, world, "GITHUB_TOKEN", "getenv_sha256") == _sha256("ghp_replaced")


def test_secret_looking_args_are_masked_and_others_kept() -> None:
    args = ["/srv/mcp/server.py", "--api-key", "k1", "--password=hunter2", "--port", "8080", "-v",
            "postgres://app:pa55word@db:5432/app", "sk-" + "a1" * 20, "@modelcontextprotocol/server-github",
            "--session-token", "--verbose"]
    assert masked_args(args) == ["/srv/mcp/server.py", "--api-key", MASK, f"--password={MASK}", "--port", "8080",
                                 "-v", MASK, MASK, "@modelcontextprotocol/server-github", "--session-token",
                                 "--verbose"]


def test_each_masked_argument_is_a_secret_to_remember_and_the_flags_are_not() -> None:
    args = ["--api-key", "k1", "--password=hunter2", "--port", "8080", "postgres://app:pa55word@db:5432/app"]
    assert secret_args(args) == ["k1", "hunter2", "postgres://app:pa55word@db:5432/app", "pa55word"]


def test_a_secret_mcp_argument_never_reaches_a_spectator(server: ServerProcess, llm_double: OpenAIDouble) -> None:
    """An argument the settings mask is a secret everywhere: a server that fails to start is quoted with its
    command line (masked) and its stderr tail (the secret hidden), in `tool_errors`, `mcp_status` and the
    `mcp_state` frames every role reads."""
    password = "Horse" + secrets.token_hex(6) + "9!"
    db_url = f"postgres://app:Tr0ub4dor{secrets.token_hex(4)}@db.internal:5432/prod"
    complain = 'echo "fatal: cannot connect to $0 with $2" >&2; exit 1'
    settings = {"mcp_servers": [{"name": "db", "command": "sh",
                                 "args": ["-c", complain, db_url, "--password", password]}]}
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double)
        spectator = invite(owner, world, "spectator", name="sam")["token"]

        async def watch_it_fail() -> str:
            async with ws_connect(server, world, spectator) as ws:
                await replay_and_snapshot(ws)
                assert owner.patch(f"/api/worlds/{world}", json={"settings": settings}).status_code == 200
                with client_for(server, spectator) as spec:
                    def failed() -> dict[str, Any] | None:
                        info: dict[str, Any] = spec.get(f"/api/worlds/{world}").json()
                        return info if "fatal" in json.dumps(info["mcp_status"]) else None
                    info = wait_until(failed, 30, what="the MCP server's failure")
                frames = await read_until(ws, lambda f: f["type"] == "mcp_state" and f["state"] == "failed", 30)
            assert "fatal: cannot connect to" in info["mcp_status"]["db"]["stderr_tail"]  # the tail is shown...
            assert MASK in info["tool_errors"]["db"]  # ...and the command line, masked as in the settings
            return json.dumps([info, frames])
        shown = asyncio.run(watch_it_fail())
    for secret in (password, db_url, db_url.split(":")[2].split("@")[0]):
        assert secret not in shown, "a spectator reads a secret MCP argument"


def test_after_a_restart_mcp_secrets_are_hidden_before_their_world_is_hosted(tmp_path: Path,
                                                                             llm_double: OpenAIDouble) -> None:
    """Worlds are hosted lazily (#30), and a world's MCP secrets were learnt only by hosting it: after a
    restart, an idle world's `/events` showed a plain-looking secret (a database password) raw, and another
    world's events showed it raw too."""
    password = f"blue-otter-{secrets.token_hex(3)}-music"  # plain words: only the known list hides it
    server = start_server(tmp_path / "data", llm=llm_double)
    try:
        with client_for(server, server.token) as owner:
            holder = make_world(owner, llm_double, agents=())
            other = make_world(owner, llm_double, agents=())
            assert owner.patch(f"/api/worlds/{holder}", json={"settings": _server_settings(
                env={"DB_PASSWORD": password})}).status_code == 200
            for world in (holder, other):
                said = owner.post(f"/api/worlds/{world}/messages", json={"content": f"we use {password} there"})
                assert said.status_code == 201 and password not in said.text
        server.stop()
        server.start()
        with client_for(server, server.token) as owner:
            shown = owner.get(f"/api/worlds/{holder}/events").text
            assert password not in shown and "we use [redacted] there" in shown
            wait_until(lambda: password not in owner.get(f"/api/worlds/{other}/events").text, 20,
                       what="the other world's copy hidden too (every world's secrets read at start)")
    finally:
        server.stop()
