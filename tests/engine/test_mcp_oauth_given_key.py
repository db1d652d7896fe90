"""The sealing key of MCP OAuth sign-ins given by the operator (`AGENT_WORLD_MCP_OAUTH_KEY`): it is kept
neither in the data folder nor in Redis, so a copy of either does not open the records it seals."""
from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from server.log.redis.connect import connect_redis
from server.tools.mcp.oauth_vault import KEY_FILE, FileVault, RedisVault, given_key
from tests.fixtures.redis_servers import RedisServer

RECORD: dict[str, Any] = {"url": "https://mcp.example/mcp", "tokens": {"access_token": "a" * 40,
                                                                      "refresh_token": "r" * 40}}


async def test_a_given_key_is_not_kept_in_the_data_folder(tmp_path: Path) -> None:
    key = os.urandom(32)
    await FileVault(tmp_path, key).save("world", "sec", RECORD)
    assert not (tmp_path / KEY_FILE).exists()
    assert await FileVault(tmp_path).load("world", "sec") is None  # a key of the folder's own does not open it
    assert await FileVault(tmp_path, key).load("world", "sec") == RECORD


async def test_a_given_key_is_never_written_to_redis(private_redis: RedisServer) -> None:
    key = os.urandom(32)
    url = f"redis://127.0.0.1:{private_redis.port}"
    given = RedisVault(await connect_redis(url), "aw", key)
    kept_in_redis = RedisVault(await connect_redis(url), "aw")
    try:
        await given.save("world", "sec", RECORD)
        assert private_redis.client().keys("*") == ["aw:mcp-oauth"]  # the sealed records, and no key
        assert await kept_in_redis.load("world", "sec") is None  # (it makes a key of its own in Redis)
        assert await given.load("world", "sec") == RECORD
    finally:
        await given.close()
        await kept_in_redis.close()


async def test_records_sealed_under_the_kept_key_are_sealed_again_under_a_given_one(tmp_path: Path) -> None:
    # A deployment that starts giving the key keeps its sign-ins, and a copy of its data folder opens none.
    await FileVault(tmp_path).save("world", "sec", RECORD)  # under the key made and kept in the folder
    key = os.urandom(32)
    assert await FileVault(tmp_path, key).adopt_kept_key() == 1
    assert not (tmp_path / KEY_FILE).exists()
    assert await FileVault(tmp_path, key).load("world", "sec") == RECORD
    assert await FileVault(tmp_path, key).adopt_kept_key() == 0  # (once: no key is kept any more)


async def test_records_in_redis_are_sealed_again_and_the_key_there_deleted(private_redis: RedisServer) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}"
    kept_in_redis = RedisVault(await connect_redis(url), "aw")
    given = RedisVault(await connect_redis(url), "aw", os.urandom(32))
    try:
        await kept_in_redis.save("world", "sec", RECORD)
        assert await given.load("world", "sec") is None
        assert await given.adopt_kept_key() == 1
        assert private_redis.client().keys("*") == ["aw:mcp-oauth"]
        assert await given.load("world", "sec") == RECORD
    finally:
        await given.close()
        await kept_in_redis.close()


class _RefreshedMeanwhile(RedisVault):
    """A vault whose reads are each followed by a save of a newer record under the kept key, by `other`: a
    process not given the key yet, refreshing its tokens between the read and the write of a record."""

    def __init__(self, client: Any, other: RedisVault, times: int) -> None:
        super().__init__(client, "aw", KEY)
        self.other, self.times = other, times

    async def _read(self, name: str) -> bytes | None:
        blob = await super()._read(name)
        if self.times:
            self.times -= 1
            await self.other.save("world", "sec", {**RECORD, "tokens": {"access_token": f"newer-{self.times}"}})
        return blob


KEY = os.urandom(32)


async def test_a_record_saved_meanwhile_under_the_kept_key_is_sealed_again_not_lost(
        private_redis: RedisServer) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}"
    kept_in_redis = RedisVault(await connect_redis(url), "aw")
    given = _RefreshedMeanwhile(await connect_redis(url), kept_in_redis, times=1)
    try:
        await kept_in_redis.save("world", "sec", RECORD)
        assert await given.adopt_kept_key() == 1  # the first write missed (the record had changed): the second
        assert (await given.load("world", "sec") or {})["tokens"] == {"access_token": "newer-0"}  # the newer one
        assert private_redis.client().keys("*") == ["aw:mcp-oauth"]
    finally:
        await given.close()
        await kept_in_redis.close()


class _SignedInMeanwhile(RedisVault):
    """A vault whose first listing is followed by a sign-in through `other`, a process not given the key yet:
    a record under a name the listing did not have."""

    def __init__(self, client: Any, other: RedisVault) -> None:
        super().__init__(client, "aw", KEY)
        self.other, self.listed = other, False

    async def _names(self) -> list[str]:
        names = await super()._names()
        if not self.listed:
            self.listed = True
            await self.other.save("world", "another-server", RECORD)
        return names


async def test_a_sign_in_saved_under_the_kept_key_during_a_pass_is_sealed_again_too(
        private_redis: RedisServer) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}"
    kept_in_redis = RedisVault(await connect_redis(url), "aw")
    given = _SignedInMeanwhile(await connect_redis(url), kept_in_redis)
    try:
        await kept_in_redis.save("world", "sec", RECORD)
        assert await given.adopt_kept_key() == 2  # the key is deleted after a pass that found none under it
        assert await given.load("world", "sec") == RECORD and await given.load("world", "another-server") == RECORD
        assert private_redis.client().keys("*") == ["aw:mcp-oauth"]
    finally:
        await given.close()
        await kept_in_redis.close()


async def test_the_kept_key_stays_while_records_keep_being_saved_under_it(private_redis: RedisServer) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}"
    kept_in_redis = RedisVault(await connect_redis(url), "aw")
    given = _RefreshedMeanwhile(await connect_redis(url), kept_in_redis, times=100)
    try:
        await kept_in_redis.save("world", "sec", RECORD)
        assert await given.adopt_kept_key() == 0
        assert "aw:mcp-oauth-key" in private_redis.client().keys("*")  # deleted, the record would open nowhere
        assert await kept_in_redis.load("world", "sec") is not None
    finally:
        await given.close()
        await kept_in_redis.close()


@pytest.mark.parametrize("text", ["", "not base64!", base64.b64encode(b"k" * 16).decode(),
                                  base64.b64encode(b"k" * 33).decode()])
def test_a_key_that_is_not_32_bytes_of_base64_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="must be 32 bytes in base64"):
        given_key(text)


def test_a_key_of_32_bytes_of_base64_is_taken_whatever_white_space_ends_it() -> None:
    assert given_key(base64.b64encode(b"k" * 32).decode() + "\n") == b"k" * 32
