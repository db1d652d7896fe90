"""MCP over OAuth 2.1 (issue #33), against a real authorization server and the MCP server it protects
(tests/fixtures/mcp_oauth_server.py, on loopback): discovery and dynamic registration, the person's
sign-in through the callback (its `state` bound to them, used once), a call with the token, a refresh
after expiry, sign-out with revocation; the tokens sealed in the data folder and in no event or log line."""
from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.auth import OAuthToken

from server import vocab
from server.errors import AppError
from server.logs import JsonFormatter
from server.redact import redact_text
from server.tools.mcp.oauth import VaultStorage, host_of, remember_record
from server.tools.mcp.oauth_vault import FOLDER, KEY_FILE, MAX_RECORD, FileVault, Sealer, place
from server.tools.mcp.tools import McpServerConfig
from tests.fixtures.engine import MEMBER, OWNER, Harness, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async
from tests.fixtures.mcp_oauth import OAuthServers, callback_query

CALLBACK = "http://127.0.0.1:9/oauth/callback"  # never opened: the test carries the redirect back itself


async def _owner() -> str:
    return OWNER.identity


async def _status(harness: Harness, server: str = "sec") -> dict[str, Any]:
    found: dict[str, Any] = (await harness.engine.get_world(harness.world))["mcp_status"][server]
    return found


async def _wait_state(harness: Harness, state: str) -> dict[str, Any]:
    return await eventually_async(lambda: _status(harness), accept=lambda s: s["state"] == state, timeout=20,
                                  what=f"the OAuth server to be {state}")


async def _world(harness: Harness, servers: OAuthServers) -> None:
    never = {"approval": "never"}
    await harness.make_world("alice", mcp_servers=[{"name": "sec", "url": servers.mcp_url, "oauth": True,
                                                    "tools": {"whoami": never, "leak": never, "echo": never}}])


async def _sign_in(harness: Harness, servers: OAuthServers) -> dict[str, Any]:
    started = await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    location = await servers.approve(started["authorization_url"])
    assert location.startswith(CALLBACK + "?")
    query = callback_query(location)
    world, server, failed = await harness.engine.mcp_sign_ins.callback(query["state"], query, _owner)
    assert (world, server, failed) == (harness.world, "sec", "")
    await _wait_state(harness, "up")
    return started


async def _record(harness: Harness, servers: OAuthServers) -> dict[str, Any]:
    config = McpServerConfig(name="sec", url=servers.mcp_url, oauth=True)
    return await VaultStorage(harness.engine.mcp_sign_ins.vault, harness.world, config).record()


async def _call(harness: Harness, tool: str, turn: int) -> str:
    harness.double.respond_with(reply_by_turn(lambda: tool_calls((f"sec__{tool}", {}))))
    await harness.say(f"call {tool} ({turn})")
    results = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == f"sec__{tool}",
                                     count=turn, timeout=20)
    await harness.idle(timeout=10)
    return str(results[turn - 1]["content"])


async def _raw_log(harness: Harness) -> str:
    return json.dumps(await harness.engine.store.log.read(harness.world, 0, 100_000))


async def test_a_person_signs_in_and_the_agent_calls_with_the_token(
        harness: Harness, oauth_servers: OAuthServers, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await _world(harness, oauth_servers)
    before = await _wait_state(harness, "failed")
    assert "not signed in" in before["reason"] and before["signed_in"] is False
    started = await _sign_in(harness, oauth_servers)
    assert started["host"] == oauth_servers.host  # what the page shows beside the link
    assert "code_challenge=" in started["authorization_url"] and "code_challenge_method=S256" in started[
        "authorization_url"]
    assert (await _status(harness))["signed_in"] is True
    stats = await oauth_servers.stats()
    assert stats["clients"] == 1 and stats["grants"] == {"authorization_code": 1, "refresh_token": 0}
    assert (await _call(harness, "whoami", 1)).startswith("client ")
    [signed] = [e for e in await harness.events() if e["kind"] == vocab.MCP_SIGNED_IN]
    assert signed["server"] == "sec" and signed["host"] == oauth_servers.host and signed["sender"] == OWNER.sender
    record = await _record(harness, oauth_servers)
    tokens = [record["tokens"]["access_token"], record["tokens"]["refresh_token"]]
    # A careless server answers with the token: it is hidden before the result is stored.
    assert "[redacted]" in await _call(harness, "leak", 1)
    shown = json.dumps(await harness.events()) + json.dumps(await harness.engine.get_world(harness.world))
    logged = "\n".join(map(JsonFormatter().format, caplog.records))  # as the server writes its log
    for token in tokens:
        assert token not in shown and token not in logged
        assert token not in await _raw_log(harness)


async def test_a_token_an_mcp_server_echoes_never_reaches_the_llm_or_the_log(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    await _sign_in(harness, oauth_servers)
    token = (await _record(harness, oauth_servers))["tokens"]["access_token"]
    assert await _call(harness, "leak", 1) == "your token is [redacted]"
    # the agent's request after the tool result carries that result: the provider never reads the token
    assert len(harness.double.requests) >= 2
    assert token not in json.dumps([request.body for request in harness.double.requests])
    assert token not in await _raw_log(harness)


async def test_the_tokens_are_sealed_in_the_data_folder_and_go_with_the_world(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    await _sign_in(harness, oauth_servers)
    record = await _record(harness, oauth_servers)
    data_dir = harness.engine.data_dir
    sealed = (data_dir / FOLDER / place(harness.world, "sec")).read_bytes()
    assert record["tokens"]["access_token"].encode() not in sealed and b"refresh_token" not in sealed
    assert stat.S_IMODE(os.stat(data_dir / KEY_FILE).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(data_dir / FOLDER / place(harness.world, "sec")).st_mode) == 0o600
    # Moved to another world's place, a record does not open there.
    other = place("another-world", "sec")
    (data_dir / FOLDER / other).write_bytes(sealed)
    assert await FileVault(data_dir).load("another-world", "sec") is None
    assert (await FileVault(data_dir).load(harness.world, "sec") or {}).get("tokens") == record["tokens"]
    # At start, every record is read without knowing its world (to hide its tokens): the moved copy does not open.
    assert [r["tokens"] for r in await FileVault(data_dir).every_record()] == [record["tokens"]]
    await harness.engine.delete_world(harness.world, OWNER)  # its sign-ins go with it
    assert not (data_dir / FOLDER / place(harness.world, "sec")).exists()


async def test_an_expired_token_is_refreshed_and_the_new_one_kept(harness: Harness,
                                                                 oauth_servers: OAuthServers) -> None:
    await oauth_servers.set_lifetime(2)
    await _world(harness, oauth_servers)
    await _sign_in(harness, oauth_servers)
    first = (await _record(harness, oauth_servers))["tokens"]
    await eventually_async(oauth_servers.stats, accept=lambda s: s["live_access"] == 0, timeout=20,
                           what="the first access token to expire at the authorization server")
    assert (await _call(harness, "whoami", 1)).startswith("client ")
    assert (await oauth_servers.stats())["grants"]["refresh_token"] >= 1
    record = await _record(harness, oauth_servers)
    kept = record["tokens"]
    assert kept["access_token"] != first["access_token"] and kept["refresh_token"] != first["refresh_token"]
    # The replaced ones stay in the record, to be hidden again after a restart (an echo of one may be logged).
    assert record["retired"][-2:] == [first["access_token"], first["refresh_token"]]
    assert await oauth_servers.call(first["access_token"]) == 401


async def test_a_token_refused_before_its_expiry_is_refreshed_not_signed_in_again(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    await _sign_in(harness, oauth_servers)
    assert (await _call(harness, "whoami", 1)).startswith("client ")
    first = (await _record(harness, oauth_servers))["tokens"]
    await oauth_servers.forget_access_tokens()  # the next call's token is refused, an hour before it expires
    assert (await _call(harness, "whoami", 2)).startswith("client ")
    assert (await oauth_servers.stats())["grants"]["refresh_token"] == 1
    assert (await _record(harness, oauth_servers))["tokens"]["access_token"] != first["access_token"]
    assert (await _status(harness))["state"] == "up"


async def test_tokens_another_process_refreshed_are_taken_from_the_vault_not_refreshed_again(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    # In the distributed mode every process holds its own connection: one that refreshed stores the new pair
    # in the shared vault, and the refresh token the others hold is used up (a refresh with it is refused).
    await _world(harness, oauth_servers)
    await _sign_in(harness, oauth_servers)
    assert (await _call(harness, "whoami", 1)).startswith("client ")  # the connection holds the first pair
    await oauth_servers.forget_access_tokens()  # the first access token is refused from now on
    config = McpServerConfig(name="sec", url=oauth_servers.mcp_url, oauth=True)
    storage = VaultStorage(harness.engine.mcp_sign_ins.vault, harness.world, config)
    await storage.set_tokens(OAuthToken(**await oauth_servers.refresh(await storage.record())))  # "elsewhere"
    assert (await _call(harness, "whoami", 2)).startswith("client ")
    assert (await oauth_servers.stats())["grants"]["refresh_token"] == 1  # only the other process's
    assert (await _status(harness))["state"] == "up"


async def test_an_expired_token_another_process_refreshed_is_taken_from_the_vault(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    await oauth_servers.set_lifetime(2)
    await _world(harness, oauth_servers)
    await _sign_in(harness, oauth_servers)
    assert (await _call(harness, "whoami", 1)).startswith("client ")
    await eventually_async(oauth_servers.stats, accept=lambda s: s["live_access"] == 0, timeout=20,
                           what="the first access token to expire")
    await oauth_servers.set_lifetime(3600)
    config = McpServerConfig(name="sec", url=oauth_servers.mcp_url, oauth=True)
    storage = VaultStorage(harness.engine.mcp_sign_ins.vault, harness.world, config)
    await storage.set_tokens(OAuthToken(**await oauth_servers.refresh(await storage.record())))  # "elsewhere"
    assert (await _call(harness, "whoami", 2)).startswith("client ")
    assert (await oauth_servers.stats())["grants"]["refresh_token"] == 1  # only the other process's


async def _registered_world(harness: Harness, servers: OAuthServers, client: dict[str, Any]) -> None:
    never = {"approval": "never"}
    await harness.make_world("alice", mcp_servers=[{"name": "sec", "url": servers.mcp_url,
                                                    "oauth": {"issuer": servers.issuer, **client},
                                                    "tools": {"whoami": never, "leak": never, "echo": never}}])


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
async def test_a_client_registered_by_hand_signs_in_where_the_server_registers_none(
        harness: Harness, oauth_servers: OAuthServers, method: str) -> None:
    # Most authorization servers (GitHub's, Google's, Slack's) register no client by themselves: its owner
    # registers one there and gives its id and secret. Before, such a server could not be signed in to at all.
    client = await oauth_servers.register_client(CALLBACK, method)
    await _registered_world(harness, oauth_servers, {**client, "token_endpoint_auth_method": method})
    await _sign_in(harness, oauth_servers)
    assert await _call(harness, "whoami", 1) == f"client {client['client_id']}"
    await oauth_servers.forget_access_tokens()  # the refresh authenticates with the secret, sent as `method` says
    assert await _call(harness, "whoami", 2) == f"client {client['client_id']}"
    stats = await oauth_servers.stats()
    assert stats["grants"]["refresh_token"] == 1 and stats["clients"] == 1  # nothing registered by itself
    # Signing out revokes the tokens as the client they were issued to. (The SDK's reference authorization
    # server answers a revocation with Basic authentication "client_secret: Field required", though RFC 6749
    # allows no second method in the body: there it is refused.)
    signed_out = await harness.engine.mcp_sign_ins.sign_out(harness.world, OWNER, "sec")
    assert signed_out == {"server": "sec", "revoked": method == "client_secret_post"}
    assert ((await oauth_servers.stats())["revoked"] >= 1) is (method == "client_secret_post")


@pytest.mark.parametrize("registration_open", [False, True])
async def test_a_registered_client_is_never_sent_to_another_authorization_server(
        harness: Harness, oauth_servers: OAuthServers, registration_open: bool) -> None:
    # The (untrusted) MCP server names its authorization server: one that is not where the owner registered
    # the client would get the client's secret with the code. Here the owner registered it "elsewhere".
    client = await oauth_servers.register_client(CALLBACK, close=not registration_open)
    never = {"approval": "never"}
    await harness.make_world("alice", mcp_servers=[{"name": "sec", "url": oauth_servers.mcp_url, "tools": {
        "whoami": never}, "oauth": {"issuer": "https://auth.example.com", **client}}])
    with pytest.raises(AppError) as stopped:
        await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    assert stopped.value.code == "mcp_sign_in_failed"
    assert f"names the authorization server {oauth_servers.issuer}" in stopped.value.message
    assert "not https://auth.example.com where its client is registered" in stopped.value.message
    stats = await oauth_servers.stats()
    assert stats["grants"] == {"authorization_code": 0, "refresh_token": 0}  # (the secret goes only to /token)
    assert not (await _record(harness, oauth_servers)).get("client_info")


async def test_a_registered_client_whose_issuer_publishes_no_metadata_goes_nowhere(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    # Without the issuer's metadata the SDK authorizes at the MCP server's own /authorize and sends the code
    # and the client's secret to its /token: the (untrusted) MCP server would get both.
    client = await oauth_servers.register_client(CALLBACK)
    await oauth_servers.hide_metadata()
    await _registered_world(harness, oauth_servers, client)
    with pytest.raises(AppError) as stopped:
        await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    assert stopped.value.code == "mcp_sign_in_failed"
    assert f"no metadata of the authorization server {oauth_servers.issuer} was found" in stopped.value.message


async def test_where_the_server_registers_no_client_the_sign_in_says_to_register_one(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    await oauth_servers.register_client(CALLBACK)  # (dynamic registration is closed from now on)
    await _world(harness, oauth_servers)
    with pytest.raises(AppError) as failed:
        await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    assert failed.value.code == "mcp_sign_in_failed"
    assert f"register one there with the redirect URI {CALLBACK}" in failed.value.message
    assert "client_id" in failed.value.message


async def test_a_sign_in_is_kept_for_its_client_only(harness: Harness, oauth_servers: OAuthServers) -> None:
    # Tokens issued to one client are no use to another: a changed client starts signed out, not failing.
    first = await oauth_servers.register_client(CALLBACK)
    await _registered_world(harness, oauth_servers, first)
    await _sign_in(harness, oauth_servers)
    second = await oauth_servers.register_client(CALLBACK)
    server = {"name": "sec", "url": oauth_servers.mcp_url, "oauth": {"issuer": oauth_servers.issuer, **second},
              "tools": {"whoami": {"approval": "never"}}}
    await harness.engine.update_world(harness.world, OWNER, settings={"mcp_servers": [server]})
    assert (await _wait_state(harness, "failed"))["signed_in"] is False
    await _sign_in(harness, oauth_servers)
    assert await _call(harness, "whoami", 1) == f"client {second['client_id']}"


async def test_a_registered_clients_secret_is_write_only_and_hidden(harness: Harness,
                                                                    oauth_servers: OAuthServers) -> None:
    client = await oauth_servers.register_client(CALLBACK)
    await _registered_world(harness, oauth_servers, client)
    [shown] = (await harness.engine.get_world(harness.world))["settings"]["mcp_servers"]
    assert shown["oauth"] == {"issuer": oauth_servers.issuer, "client_id": client["client_id"],
                              "client_secret": "•••", "token_endpoint_auth_method": "client_secret_basic"}
    await harness.engine.update_world(harness.world, OWNER, settings={"mcp_servers": [shown]})  # ••• keeps it
    await _sign_in(harness, oauth_servers)
    assert await _call(harness, "whoami", 1) == f"client {client['client_id']}"
    assert redact_text(f"secret {client['client_secret']}") == "secret [redacted]"
    # A secret belongs to one client of one authorization server: ••• stands for nothing once either changes.
    for changed in ({"url": "https://mcp.example/mcp"}, {"oauth": {**shown["oauth"], "client_id": "other"}},
                    {"oauth": {**shown["oauth"], "issuer": "https://auth.example.com"}},
                    {"name": "other"}):
        with pytest.raises(AppError, match="no stored secret belongs to that client"):
            await harness.engine.update_world(harness.world, OWNER, settings={"mcp_servers": [{**shown, **changed}]})


@pytest.mark.parametrize(("oauth", "says"), [
    ({"issuer": "https://a.example", "client_id": ""}, "oauth.client_id is 1 to 500"),
    ({"client_id": "a"}, "oauth.issuer is the http"),
    ({"issuer": "ftp://a.example", "client_id": "a"}, "oauth.issuer is the http"),
    ({"issuer": "https://a.example", "client_id": "a", "client_secret": "short"}, "client_secret is 8 to 500"),
    ({"issuer": "https://a.example", "client_id": "a", "client_secret": "s" * 20,
      "token_endpoint_auth_method": "none"}, "client_secret_basic or"),
    ({"issuer": "https://a.example", "client_id": "a", "token_endpoint_auth_method": "client_secret_post"},
     "none without a client_secret"),
    ({"issuer": "https://a.example", "client_id": "a", "scope": "x"}, "registered client"),
    ("yes", "registered client")])
async def test_a_registered_client_that_is_not_one_is_refused_with_why(harness: Harness, oauth: object,
                                                                       says: str) -> None:
    with pytest.raises(AppError, match=says):
        await harness.make_world("alice", mcp_servers=[{"name": "sec", "url": "https://mcp.example/mcp",
                                                        "oauth": oauth}])


async def test_signing_out_revokes_and_deletes_the_tokens(harness: Harness, oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    await _sign_in(harness, oauth_servers)
    tokens = (await _record(harness, oauth_servers))["tokens"]
    assert await oauth_servers.call(tokens["access_token"]) == 200
    with pytest.raises(AppError) as refused:
        await harness.engine.mcp_sign_ins.sign_out(harness.world, MEMBER, "sec")
    assert refused.value.code == vocab.FORBIDDEN
    assert await harness.engine.mcp_sign_ins.sign_out(harness.world, OWNER, "sec") == {"server": "sec",
                                                                                        "revoked": True}
    assert (await oauth_servers.stats())["revoked"] >= 1
    assert await oauth_servers.call(tokens["access_token"]) == 401
    assert await _record(harness, oauth_servers) == {}
    status = await _wait_state(harness, "failed")
    assert "not signed in" in status["reason"] and status["signed_in"] is False
    [out] = [e for e in await harness.events() if e["kind"] == vocab.MCP_SIGNED_OUT]
    assert out["server"] == "sec" and out["revoked"] is True and out["sender"] == OWNER.sender
    assert tokens["access_token"] not in await _raw_log(harness)


async def test_a_sign_in_is_finished_only_by_its_person_and_only_once(harness: Harness,
                                                                      oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    with pytest.raises(AppError) as member:
        await harness.engine.mcp_sign_ins.start(harness.world, MEMBER, "sec", CALLBACK)
    assert member.value.code == vocab.FORBIDDEN
    started = await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    query = callback_query(await oauth_servers.approve(started["authorization_url"]))

    async def someone_else() -> str:
        return MEMBER.identity

    async def nobody() -> None:
        return None
    for who in (someone_else, nobody):
        with pytest.raises(AppError) as wrong:
            await harness.engine.mcp_sign_ins.callback(query["state"], query, who)
        assert wrong.value.code == vocab.FORBIDDEN
    with pytest.raises(AppError) as unknown:
        await harness.engine.mcp_sign_ins.callback("not-a-state", query, _owner)
    assert unknown.value.code == vocab.NOT_FOUND
    # Refused for the wrong person, it still waits for the right one; once used, it is gone.
    assert (await harness.engine.mcp_sign_ins.callback(query["state"], query, _owner))[2] == ""
    with pytest.raises(AppError) as again:
        await harness.engine.mcp_sign_ins.callback(query["state"], query, _owner)
    assert again.value.code == vocab.NOT_FOUND


async def test_a_refused_authorization_fails_the_sign_in_with_the_reason(harness: Harness,
                                                                         oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    started = await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    state = callback_query(started["authorization_url"])["state"]
    _, _, failed = await harness.engine.mcp_sign_ins.callback(state, {"error": "access_denied"}, _owner)
    assert "access_denied" in failed
    assert (await _status(harness))["signed_in"] is False
    assert not [e for e in await harness.events() if e["kind"] == vocab.MCP_SIGNED_IN]


async def test_a_huge_token_fails_the_sign_in_and_is_never_stored(harness: Harness,
                                                                   oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    await oauth_servers.set_token_size(100_000)  # hiding it by its value would cost gigabytes (redact.py)
    started = await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    query = callback_query(await oauth_servers.approve(started["authorization_url"]))
    _, _, failed = await harness.engine.mcp_sign_ins.callback(query["state"], query, _owner)
    assert "access_token of 100000 characters" in failed and "refused" in failed
    assert not (await _record(harness, oauth_servers)).get("tokens")
    assert (await _status(harness))["signed_in"] is False


async def test_a_sign_in_link_whose_host_is_disguised_by_a_user_name_is_refused(
        harness: Harness, oauth_servers: OAuthServers) -> None:
    await _world(harness, oauth_servers)
    await oauth_servers.set_authorize_userinfo("accounts.google.com")  # shown as that, it opens 127.0.0.1
    with pytest.raises(AppError) as refused:
        await harness.engine.mcp_sign_ins.start(harness.world, OWNER, "sec", CALLBACK)
    assert refused.value.code == "mcp_sign_in_failed" and "user name" in refused.value.message
    assert host_of("https://accounts.google.com@evil.example/authorize?state=x") == "evil.example"


def test_remembering_a_secret_is_bounded_in_length() -> None:
    # In a process of its own: before the bound, remembering this one took seconds and 5 GB.
    script = ("from server.redact import hide_known, known_secrets, remember_secret; remember_secret('A' * 30000); "
              "print(known_secrets() == () and hide_known('A' * 30000) == 'A' * 30000)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).parents[2])
    assert out.stdout.split() == ["True"], out.stderr  # refused (and said in the log), not remembered


def test_a_sealed_record_is_bounded_in_size() -> None:
    sealer = Sealer(bytes(32))
    assert sealer.open("p", sealer.seal("p", {"metadata": "x" * 1000})) == {"metadata": "x" * 1000}
    with pytest.raises(ValueError, match="too much to keep"):
        sealer.seal("p", {"metadata": "x" * (MAX_RECORD + 1)})


def test_a_record_read_after_a_restart_hides_the_tokens_it_replaced_too() -> None:
    old, new = "at_" + "7c1e5b2d8f4a6c0e9f3a" * 2, "at_" + "0e9f3a7c1e5b2d8f4a6c" * 2
    remember_record({"tokens": {"access_token": new}, "retired": [old]})  # what loading it does
    assert redact_text(f"echoed {old} and {new}") == "echoed [redacted] and [redacted]"
