"""Credentials that commands and connection strings carry by position: hidden from clients (value redaction,
server/redact.py) and masked in MCP servers' arguments (server/tools/mcp/masking.py), the rest kept."""
from __future__ import annotations

import secrets

import pytest

from server.engine.public import public
from server.redact import REDACTED, redact_text
from server.tools.mcp.masking import MASK, masked_args, secret_args


@pytest.mark.parametrize(("text", "shown"), [
    ('curl -H "Authorization: Basic dXNlcjpodW50ZXIy" https://api', f'curl -H "Authorization: Basic {REDACTED}" https://api'),
    ("authorization: basic dXNlcjpodW50ZXIy", f"authorization: basic {REDACTED}"),
    ("curl -s -u alice:hunter2pw https://api", f"curl -s -u alice:{REDACTED} https://api"),
    ("curl --user alice:hunter2pw https://api", f"curl --user alice:{REDACTED} https://api"),
    ("PGPASSWORD=hunter2 psql -h db app", f"PGPASSWORD={REDACTED} psql -h db app"),
    ('export DEPLOY_TOKEN="hunter2" MY_API_KEY=hunter3', f'export DEPLOY_TOKEN="{REDACTED}" MY_API_KEY={REDACTED}'),
    ("mysql -u root -phunter2 app", f"mysql -u root -p{REDACTED} app"),
    ("mysqldump -phunter2 app > dump.sql", f"mysqldump -p{REDACTED} app > dump.sql"),
    ("sshpass -p hunter2 ssh deploy@host", f"sshpass -p {REDACTED} ssh deploy@host"),
    ("sshpass -p'hunter2' ssh deploy@host", f"sshpass -p'{REDACTED}' ssh deploy@host"),
])
def test_credentials_given_by_position_in_a_command_are_hidden_and_the_command_kept(text: str, shown: str) -> None:
    assert redact_text(text) == shown


@pytest.mark.parametrize("text", [
    "git push -u origin main", "sort -u names.txt", "MAX_TOKENS=100 run", "Basic setup: see the authorization docs",
    "psql -p 5432 -h db", "ls -p /tmp",
])
def test_ordinary_commands_near_those_shapes_are_shown_as_they_are(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize("world", ["engineering-platform-sandbox-environment", "customersupportescalations"])
def test_an_invite_token_of_a_world_with_a_long_wordy_id_is_hidden(world: str) -> None:
    """A token is `<world id>.<32 random characters>`: a long id of words made the whole look like words
    (measured on the old code: 6 tokens in 10 of the first world, half of the second's, shown in clear)."""
    for _ in range(50):
        token = f"{world}.{secrets.token_urlsafe(24)}"
        event = public({"kind": "message", "role": "user", "sender": "member:mia", "content": f"join with {token}"})
        assert event["content"] == f"join with {REDACTED}" and event["redacted"] is True, token


@pytest.mark.parametrize(("args", "shown", "hidden"), [
    (["-u", "root", "-p", "hunter2", "app"], ["-u", "root", "-p", MASK, "app"], ["hunter2"]),
    (["--dsn", "host=db user=app password=hunter2 sslmode=require"],
     ["--dsn", f"host=db user=app password={MASK} sslmode=require"], ["hunter2"]),
    (["DB_PASSWORD=hunter2", "GITHUB_TOKEN=abc", "SIGNING_KEY=k1", "CLIENT_SECRET=s1", "NODE_ENV=production"],
     [f"DB_PASSWORD={MASK}", f"GITHUB_TOKEN={MASK}", f"SIGNING_KEY={MASK}", f"CLIENT_SECRET={MASK}",
      "NODE_ENV=production"],
     ["hunter2", "abc", "k1", "s1"]),
    (["-y", "@modelcontextprotocol/server-postgres", "--read-only"],
     ["-y", "@modelcontextprotocol/server-postgres", "--read-only"], []),
])
def test_mcp_arguments_hide_short_password_flags_labelled_values_and_secret_variables(
        args: list[str], shown: list[str], hidden: list[str]) -> None:
    assert masked_args(args) == shown
    assert secret_args(args) == hidden
