"""Where an MCP server's OAuth sign-in is kept: one sealed record per world and server (issue #33).

A record holds the tokens, the client's registration and the authorization server's metadata (what
refreshing and revoking need after a restart). It is sealed with AES-256-GCM under the deployment's key,
with the world and server as associated data: a record moved to another world's place does not open.

Embedded mode: the key is `mcp-oauth.key` in the data folder and each record a file under `mcp-oauth/`,
readable by this user only (0600), like `owner.token`. Distributed mode: records are one Redis hash of
the deployment, and the key, like the VAPID key (server/push/keys.py), a Redis key every process shares.
In either mode the operator may give the key instead (`AGENT_WORLD_MCP_OAUTH_KEY`): it is then kept
nowhere beside the records, so a copy of the data folder or of Redis does not open them.
Nothing here is ever sent to a client: the records leave only towards the authorization server and the
MCP server they belong to.
"""
from __future__ import annotations

import abc
import asyncio
import base64
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ...key_files import read_or_make

logger = logging.getLogger(__name__)

KEY_FILE = "mcp-oauth.key"
FOLDER = "mcp-oauth"
_NONCE = 12
MAX_RECORD = 64 * 1024  # bytes of a record: its parts come from the (untrusted) authorization server
KEY_ENV = "AGENT_WORLD_MCP_OAUTH_KEY"  # the key given by the operator: 32 bytes in base64


def given_key(text: str) -> bytes:
    """The key in `text` (KEY_ENV's value); a ValueError that says how to make one otherwise."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError(f"{KEY_ENV} must be 32 bytes in base64 (44 characters), e.g. the output of "
                         "python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())'")
    return key


class Sealer:
    """AES-256-GCM with a fresh nonce per record; the associated data binds a record to its place."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the MCP OAuth key must be 32 bytes")
        self._aead = AESGCM(key)

    def seal(self, place: str, record: dict[str, Any]) -> bytes:
        plain = json.dumps(record).encode()
        if len(plain) > MAX_RECORD:
            raise ValueError(f"the sign-in's record is {len(plain)} bytes (at most {MAX_RECORD}): the "
                             "authorization server sent too much to keep")
        nonce = os.urandom(_NONCE)
        return nonce + self._aead.encrypt(nonce, plain, place.encode())

    def open(self, place: str, blob: bytes) -> dict[str, Any] | None:
        """The record, or None when it does not open here (another key, another place, damaged)."""
        try:
            found = json.loads(self._aead.decrypt(blob[:_NONCE], blob[_NONCE:], place.encode()))
        except (InvalidTag, ValueError):
            return None
        return found if isinstance(found, dict) else None


def _new_key() -> bytes:
    return base64.b64encode(AESGCM.generate_key(bit_length=256))


def place(world: str, server: str) -> str:
    """A record's name: a digest, so that no world or server name becomes a path or a key of its own."""
    return hashlib.sha256(f"{world}\0{server}".encode()).hexdigest()


class Vault(abc.ABC):
    """Sealed records by (world, server). Subclasses keep the sealed bytes, and the key unless one is `given`."""

    def __init__(self, given: bytes | None = None) -> None:
        self._sealer: Sealer | None = Sealer(given) if given is not None else None
        self._lock = asyncio.Lock()

    @abc.abstractmethod
    async def _key(self) -> bytes: ...

    @abc.abstractmethod
    async def _read(self, name: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _write(self, name: str, blob: bytes) -> None: ...

    @abc.abstractmethod
    async def _remove(self, name: str) -> None: ...

    @abc.abstractmethod
    async def _names(self) -> list[str]: ...

    @abc.abstractmethod
    async def _kept_key(self) -> bytes | None:
        """The key kept beside the records (None when there is none), never made here."""

    @abc.abstractmethod
    async def _forget_kept_key(self) -> None: ...

    async def _replace(self, name: str, old: bytes, new: bytes) -> bool:
        """Write `new` where `old` is still stored (a concurrent save wins over it); whether it was."""
        await self._write(name, new)
        return True

    async def adopt_kept_key(self, passes: int = 4) -> int:
        """With a given key: seal under it again the records sealed under the key kept beside them (made
        before a key was given), then delete that key, so that a copy of the records no longer opens them
        and nobody has to sign in again. How many records were sealed again.

        A record saved meanwhile under the kept key (a process not given the key yet signed in or refreshed)
        is taken in a next pass; the key is deleted only after a pass that found none under it, or else
        kept, with a warning: deleted, it would leave such records unreadable."""
        kept = await self._kept_key() if self._sealer is not None else None
        if kept is None or len(kept) != 32 or self._sealer is None:  # (a damaged one opens nothing)
            return 0
        old, new, moved = Sealer(kept), self._sealer, 0
        for _ in range(passes):
            found = 0  # records under the kept key in this pass, sealed again or not
            for name in await self._names():
                blob = await self._read(name)
                if blob is None or new.open(name, blob) is not None:
                    continue
                record = old.open(name, blob)
                if record is None:
                    continue
                found += 1
                if await self._replace(name, blob, new.seal(name, record)):
                    moved += 1
            if not found:
                await self._forget_kept_key()
                return moved
        logger.warning("MCP OAuth records are still being saved under the key kept beside them (a process not "
                       "given %s?): that key is kept; give the key to every process", KEY_ENV)
        return moved

    async def every_record(self) -> list[dict[str, Any]]:
        """Every record that opens here (a record's name is its associated data: no world needs to be known)."""
        found = []
        for name in await self._names():
            blob = await self._read(name)
            record = (await self.sealer()).open(name, blob) if blob is not None else None
            if record is not None:
                found.append(record)
        return found

    async def sealer(self) -> Sealer:
        async with self._lock:  # one key made, even by concurrent first uses
            if self._sealer is None:
                self._sealer = Sealer(await self._key())
            return self._sealer

    async def load(self, world: str, server: str) -> dict[str, Any] | None:
        name = place(world, server)
        blob = await self._read(name)
        if blob is None:
            return None
        record = (await self.sealer()).open(name, blob)
        if record is None:
            logger.warning("the OAuth record of MCP server %r in %s does not open with this key: ignored",
                           server, world)
        return record

    async def save(self, world: str, server: str, record: dict[str, Any]) -> None:
        name = place(world, server)
        await self._write(name, (await self.sealer()).seal(name, record))

    async def delete(self, world: str, server: str) -> None:
        await self._remove(place(world, server))


class FileVault(Vault):
    """Embedded mode: the data folder."""

    def __init__(self, data_dir: Path, key: bytes | None = None) -> None:
        super().__init__(key)
        self.data_dir = Path(data_dir)

    async def _key(self) -> bytes:
        return await asyncio.to_thread(self._file_key)

    def _file_key(self) -> bytes:
        path = self.data_dir / KEY_FILE
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            return base64.b64decode(read_or_make(path, _new_key).strip(), validate=True)
        except ValueError as exc:
            raise ValueError(f"{path} does not hold an MCP OAuth key ({exc}): delete it to make a new one "
                             "(every MCP server then has to be signed in to again)") from exc

    def _path(self, name: str) -> Path:
        return self.data_dir / FOLDER / name

    async def _kept_key(self) -> bytes | None:
        def read() -> bytes | None:
            try:
                return base64.b64decode((self.data_dir / KEY_FILE).read_bytes().strip(), validate=True)
            except (FileNotFoundError, ValueError):  # (not base64: it opens nothing)
                return None
        return await asyncio.to_thread(read)

    async def _forget_kept_key(self) -> None:
        await asyncio.to_thread(lambda: (self.data_dir / KEY_FILE).unlink(missing_ok=True))

    async def _read(self, name: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                return self._path(name).read_bytes()
            except FileNotFoundError:
                return None
        return await asyncio.to_thread(read)

    async def _write(self, name: str, blob: bytes) -> None:
        def write() -> None:
            folder = self._path(name).parent
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            # A name of its own (0600): two saves at once, in one process or two, never write one file.
            fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(blob)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, self._path(name))  # whole or not at all: a refresh never leaves half a record
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        await asyncio.to_thread(write)

    async def _remove(self, name: str) -> None:
        await asyncio.to_thread(lambda: self._path(name).unlink(missing_ok=True))

    async def _names(self) -> list[str]:
        folder = self.data_dir / FOLDER
        return await asyncio.to_thread(lambda: sorted(p.name for p in folder.glob("[0-9a-f]*")) if folder.is_dir()
                                       else [])


_REPLACE = """if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) return 1 end return 0"""


class RedisVault(Vault):
    """Distributed mode: a hash of the deployment (`{prefix}:mcp-oauth`), and its key beside it."""

    def __init__(self, client: Any, namespace: str, key: bytes | None = None) -> None:
        super().__init__(key)
        self.client = client  # a connect_redis client (str replies): sealed bytes are stored as base64
        self.hash, self.key_name = f"{namespace}:mcp-oauth", f"{namespace}:mcp-oauth-key"

    async def _key(self) -> bytes:
        await self.client.set(self.key_name, _new_key().decode(), nx=True)
        return base64.b64decode(await self.client.get(self.key_name))

    async def _read(self, name: str) -> bytes | None:
        stored = await self.client.hget(self.hash, name)
        return base64.b64decode(stored) if stored else None

    async def _write(self, name: str, blob: bytes) -> None:
        await self.client.hset(self.hash, name, base64.b64encode(blob).decode())

    async def _remove(self, name: str) -> None:
        await self.client.hdel(self.hash, name)

    async def _names(self) -> list[str]:
        return sorted(await self.client.hkeys(self.hash))

    async def _kept_key(self) -> bytes | None:
        kept = await self.client.get(self.key_name)
        try:
            return base64.b64decode(kept, validate=True) if kept else None
        except ValueError:
            return None

    async def _forget_kept_key(self) -> None:
        await self.client.delete(self.key_name)

    async def _replace(self, name: str, old: bytes, new: bytes) -> bool:
        # (other processes may be refreshing meanwhile: their newer record is kept)
        return bool(await self.client.eval(_REPLACE, 1, self.hash, name, base64.b64encode(old).decode(),
                                           base64.b64encode(new).decode()))

    async def close(self) -> None:
        await self.client.aclose()
