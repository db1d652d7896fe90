"""MCP OAuth sign-in across processes (issue #33): two engines on one Redis, as behind a balancer without
affinity. The sign-in starts on one; the authorization server's redirect lands on the other, which hands the
callback over the bus to the one holding the flow (its PKCE verifier never moves); the person check holds
there too. The tokens are sealed in Redis, readable by both, and never in the clear there."""
from __future__ import annotations

import json
from functools import partial

import pytest
import redis

from server import vocab
from server.api.auth.sessions import _namespace
from server.engine.engine import Engine
from server.engine.world.sign_in_relay import _channels
from server.errors import AppError
from server.log.redis.connect import connect_redis
from server.tools.mcp.oauth import VaultStorage
from server.tools.mcp.oauth_vault import RedisVault
from server.tools.mcp.tools import McpServerConfig
from tests.fixtures.engine import MEMBER, OWNER, RedisEngines
from tests.fixtures.eventually import eventually_async
from tests.fixtures.mcp_oauth import OAuthServers, callback_query

CALLBACK = "http://127.0.0.1:9/oauth/callback"


async def _owner() -> str:
    return OWNER.identity


async def _member() -> str:
    return MEMBER.identity


async def _nobody() -> str | None:
    return None


async def _with_vault(engines: RedisEngines, name: str) -> Engine:
    """An engine as `agent-world serve --redis` makes it: its sign-ins in the deployment's Redis vault."""
    engine = await engines.start(engines.data_dir / name)
    engine.mcp_sign_ins.use_vault(RedisVault(await connect_redis(engines.url), _namespace("aw")))
    return engine


async def test_a_callback_landing_on_another_process_finishes_the_sign_in(
        redis_engines: RedisEngines, oauth_servers: OAuthServers) -> None:
    a, b = await _with_vault(redis_engines, "a"), await _with_vault(redis_engines, "b")
    world = (await a.create_world(OWNER, "shared", {"mcp_servers": [
        {"name": "sec", "url": oauth_servers.mcp_url, "oauth": True}]}))["id"]
    started = await a.mcp_sign_ins.start(world, OWNER, "sec", CALLBACK)
    query = callback_query(await oauth_servers.approve(started["authorization_url"]))

    async with a.store.bus.subscribe(_channels(query["state"])[0], maxsize=16) as relayed:
        with pytest.raises(AppError) as nobody:  # no signed-in person: refused before anything is relayed
            await b.mcp_sign_ins.callback(query["state"], query, _nobody)
        with pytest.raises(AppError) as elsewhere:  # relayed, refused where the sign-in is held, still waiting
            await b.mcp_sign_ins.callback(query["state"], query, _member)
        assert nobody.value.code == elsewhere.value.code == vocab.FORBIDDEN
        assert json.loads(await relayed.get())["identity"] == MEMBER.identity  # the first relayed is the member's
    assert await b.mcp_sign_ins.callback(query["state"], query, _owner) == (world, "sec", "")
    with pytest.raises(AppError) as again:  # used once: nobody holds it any more
        await b.mcp_sign_ins.callback(query["state"], query, _owner)
    assert again.value.code == vocab.NOT_FOUND

    for engine in (a, b):
        status = await eventually_async(partial(engine.get_world, world), timeout=20,
                                        accept=lambda info: info["mcp_status"]["sec"]["state"] == "up",
                                        what="the server signed in and up on both processes")
        assert status["mcp_status"]["sec"]["signed_in"] is True
    config = McpServerConfig(name="sec", url=oauth_servers.mcp_url, oauth=True)
    tokens = (await VaultStorage(b.mcp_sign_ins.vault, world, config).record())["tokens"]
    stored = redis.Redis.from_url(redis_engines.url).hgetall(f"{_namespace('aw')}:mcp-oauth")
    assert len(stored) == 1 and tokens["access_token"] not in str(stored)
    assert [r["tokens"] for r in await a.mcp_sign_ins.vault.every_record()] == [tokens]
    assert [e["kind"] for e in await b.events(world) if e["kind"] == vocab.MCP_SIGNED_IN] == [vocab.MCP_SIGNED_IN]
