"""The distributed event log: Redis, shared by any number of server processes.

Every append is one Lua script, so Redis runs it atomically: all processes agree on each
world's `seq` and on which conditional append ("the first decision wins") got in first.

Keys of one world share the hash tag `{prefix:world}`, so they would live on one cluster slot:

    {aw:w}:seq          string      the world's last seq (INCR)
    {aw:w}:events       hash        seq -> event JSON (without `seq`; added on read)
    {aw:w}:open         hash        open key -> seq of the event that opened it
    {aw:w}:openlex      sorted set  open keys, all scored 0, for ZRANGEBYLEX prefix listing
    {aw:w}:claims       set         permanent claims
    {aw:w}:tag:<tag>    sorted set  seqs of the events carrying <tag>, scored by seq
    {aw:w}:lease:<name> string      the holder of a lease of the world (with a TTL)
    {aw:w}:fence:<name> string      that lease's fencing token (kept for good)
    {aw:w}:receipt:<id> string      an append's first seq, for a minute: a retried append is not run twice
    {aw:w}:listed       string      present while the world is in the work index
    {aw:w}:unlisting    string      a release's token while it takes the world out of the index
    {aw:w}:intent       string      a process's token while it puts the world into the index (expires)
    {aw}:worlds         set         every world with at least one event (kept for processes of before)
    {aw}:worldlex       sorted set  the same, all scored 0: pages of worlds in id order (ZRANGEBYLEX)
    {aw}:work           sorted set  the work index: worlds with open work, all scored 0
    {aw}:indexed        string      set once `worldlex` and `work` were built from the data of before

The work index lives in another slot than the worlds' keys, so no script can change both: a world
enters it *before* the append that opens its first work item (the `intent` keeps a release off
meanwhile, and the append script refuses work in a world that is not `listed`), and a release
takes it out in three steps that a concurrent append calls off (see `unlist_if_idle`).
    {aw}:lease:<name>, {aw}:fence:<name>   leases of no world (a process's own)

Reads never scan a log: they fetch exactly the seqs they need with HMGET. Every script names every
key it touches in KEYS, and those keys share one hash tag, so all of it runs on Redis Cluster too:
`redis+cluster://host:port` picks redis-py's cluster client.
"""
from __future__ import annotations

import itertools
import secrets
from collections.abc import Sequence
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...vocab import WORK_PREFIXES, Event
from ..base import Batched, Conflict, EventLog, opens_work, stored_body
from ..codec import decoded, encode_stored_off_loop, finish
from .append import APPEND_LUA, Pending, encode_ops, send_appends
from .connect import (
    COMMAND_TIMEOUT,
    DEFAULT_URL,
    RETRY_ONCE,
    connect_redis,
    escape_name,
    is_cluster_url,
    storage_error,
)
from .pipelined import Pipelined
from .read import READ_LUA, by_key, in_order
from .wire import Wire

_NOT_OPEN = "RedisLog is not open: use `await RedisLog.open(url, prefix)`"

# Take or renew a lease: KEYS[1] the lease, KEYS[2] its fencing token, ARGV[1] the holder,
# ARGV[2] its ttl in ms, ARGV[3] '1' for a mark (its token expires with it). Returns the token (a new
# one unless renewed), or 0 when another holds it.
_LEASE_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local token = holder and redis.call('GET', KEYS[2])
if not token then token = redis.call('INCR', KEYS[2]) end
if ARGV[3] == '1' then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return tonumber(token)
"""

# Release a lease only if this holder has it (a mark's token with it: ARGV[2] '1').
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('DEL', KEYS[2]) end
return redis.call('DEL', KEYS[1])
"""


# Put a world into the work index, step 1 (then ZADD): KEYS[1] its intent, KEYS[2] its unlisting; ARGV[1]
# the token, ARGV[2] its ttl in ms. Calls off a release under way, and keeps others off until the append.
_INTENT_LUA = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
return 1
"""

# Take a world out of the work index, step 1: KEYS[1] openlex, KEYS[2] intent, KEYS[3] unlisting; ARGV[1]
# the token, ARGV[2] its ttl in ms, ARGV[3..] lex ranges of the work items. 1 when idle (unlisting set).
_UNLIST_BEGIN_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for i = 3, #ARGV, 2 do
  if redis.call('ZLEXCOUNT', KEYS[1], ARGV[i], ARGV[i + 1]) > 0 then return 0 end
end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
return 1
"""

# Step 3 (after ZREM): KEYS[1] unlisting, KEYS[2] listed; ARGV[1] the token. 0 when an append opening
# work (or an intent) called the release off meanwhile: the caller puts the world back.
_UNLIST_END_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""
_WORK_LEX = [bound for prefix in WORK_PREFIXES for bound in (b"[" + prefix.encode(), b"[" + prefix.encode() + b"\xff")]
MARK_TTL_MS = 30_000  # how long an intent or a release may take (a process paused longer starts over)


class RedisLog(EventLog):
    def __init__(self, url: str = DEFAULT_URL, prefix: str = "aw") -> None:
        self.url = url
        self.prefix = prefix
        self._prefix = escape_name(prefix)
        self._client: Any = None  # aioredis.Redis, or RedisCluster
        self._wire: Wire | None = None  # the appends' own connection (single server)
        self._read_wire: Wire | None = None  # the reads' own (single server)
        self._append_script: AsyncScript | None = None
        self._read_script: AsyncScript | None = None
        self._lease_script: AsyncScript | None = None
        self._release_script: AsyncScript | None = None
        self._intent_script: AsyncScript | None = None
        self._unlist_begin: AsyncScript | None = None
        self._unlist_end: AsyncScript | None = None
        self._listed: set[str] = set()  # worlds this process knows are in the worlds set
        self._world_keys_of: dict[str, list[str]] = {}  # the append script's five keys of a world (never mutated)
        # Receipt ids: random per log, then counted (unique, as a random id per append was, for less CPU)
        self._receipt_ids = map(f"receipt:{secrets.token_hex(8)}-{{}}".format, itertools.count())
        # Concurrent appends (any worlds) share round trips: one pipeline of EVALSHA, each atomic.
        self._appends: Pipelined[Pending] = Pipelined(self._send_appends, "redis-log-appends")
        # Reads too: a burst of handshakes (each a few reads) then needs one connection, not hundreds
        # of the pool's, which ran out under 1,000 concurrent WebSockets (and starved lease renewals).
        self._reads: Pipelined[tuple[Any, ...]] = Pipelined(self._send_reads, "redis-log-reads")

    @classmethod
    async def open(cls, url: str = DEFAULT_URL, prefix: str = "aw") -> RedisLog:
        log = cls(url, prefix)
        log._client = await connect_redis(url, socket_timeout=COMMAND_TIMEOUT, retry=RETRY_ONCE)
        if not is_cluster_url(url):
            log._wire, log._read_wire = Wire(log._client), Wire(log._client)
        log._append_script = log._client.register_script(APPEND_LUA)
        log._read_script = log._client.register_script(READ_LUA)
        log._lease_script = log._client.register_script(_LEASE_LUA)
        log._release_script = log._client.register_script(_RELEASE_LUA)
        log._intent_script = log._client.register_script(_INTENT_LUA)
        log._unlist_begin = log._client.register_script(_UNLIST_BEGIN_LUA)
        log._unlist_end = log._client.register_script(_UNLIST_END_LUA)
        try:
            await log._build_indexes()
        except (RedisError, OSError) as exc:
            await log.close()
            raise storage_error(exc) from exc
        return log

    async def _build_indexes(self) -> None:
        """Once per prefix: the pages of worlds and the work index, from data written before they existed."""
        if await self._r.exists(self._indexed_key):
            return
        worlds = sorted(await self._r.smembers(self._worlds_key))
        for start in range(0, len(worlds), 1000):
            chunk = worlds[start:start + 1000]
            async with self._r.pipeline(transaction=False) as pipe:
                for world in chunk:
                    for low, high in zip(_WORK_LEX[::2], _WORK_LEX[1::2], strict=True):
                        pipe.zlexcount(self._key(world, "openlex"), low, high)
                counts = await pipe.execute()
            n = len(WORK_PREFIXES)
            busy = [w for i, w in enumerate(chunk) if any(counts[i * n:(i + 1) * n])]
            await self._r.zadd(self._worldlex_key, dict.fromkeys(chunk, 0))
            for world in busy:
                await self._r.set(self._key(world, "listed"), "1")
            if busy:
                await self._r.zadd(self._work_key, dict.fromkeys(busy, 0))
        await self._r.set(self._indexed_key, "1")

    # -- key names ---------------------------------------------------------------
    def _key(self, world: str, suffix: str) -> str:
        return f"{{{self._prefix}:{escape_name(world)}}}:{suffix}"

    def _tag_key(self, world: str, tag: str) -> str:
        return self._key(world, f"tag:{tag}")

    @property
    def _worlds_key(self) -> str:
        return f"{{{self._prefix}}}:worlds"

    @property
    def _worldlex_key(self) -> str:
        return f"{{{self._prefix}}}:worldlex"

    @property
    def _work_key(self) -> str:
        return f"{{{self._prefix}}}:work"

    @property
    def _indexed_key(self) -> str:
        return f"{{{self._prefix}}}:indexed"

    @property
    def _r(self) -> Any:
        if self._client is None:
            raise RuntimeError(_NOT_OPEN)
        return self._client

    # -- writes ------------------------------------------------------------------
    async def append_batch(self, world: str, items: Sequence[Batched]) -> list[Event]:
        if not items:
            return []
        if self._append_script is None:
            raise RuntimeError(_NOT_OPEN)
        pending = Pending(world, self._key(world, next(self._receipt_ids)))
        pending.work = 1 if any(opens_work(ops) for _, ops in items) else 0
        bodies = []
        for event, ops in items:
            body = stored_body(world, event)
            bodies.append(body)
            script_ops, tags, fences = encode_ops(ops)
            pending.events.append((await encode_stored_off_loop(body), script_ops, tags, [
                (f.lease, self._lease_keys(f.lease, world)[1], int(f.token)) for f in fences] if fences else []))
        result = await self._append(pending)
        if result == ["unlisted", ""]:
            # Its first work item (since it was released): into the work index first, then the append.
            pending.work, pending.token = 2, secrets.token_hex(8)
            await self._list_for_work(world, pending.token)
            result = await self._append(pending)
        if isinstance(result, list):
            reason, key = result
            raise Conflict(key, reason)  # "unlisted" again: paused past MARK_TTL_MS (nothing was written)
        if world not in self._listed:
            # Not in the script: the worlds sets live in another cluster slot than the world's keys.
            try:
                await self._r.sadd(self._worlds_key, world)
                await self._r.zadd(self._worldlex_key, {world: 0})
            except (RedisError, OSError) as exc:
                raise storage_error(exc, may_have_stored=True) from exc  # the events are stored
            self._listed.add(world)
        for seq, body in enumerate(bodies, start=int(result)):
            body["seq"] = seq
        return bodies

    async def _append(self, pending: Pending) -> Any:
        try:
            return await self._appends.call(pending)
        except (RedisError, OSError) as exc:
            # A timeout, or a connection broken after the script was sent (and again on its one retry): it
            # may have run, its answer lost.
            raise storage_error(exc, may_have_stored=isinstance(exc, RedisTimeoutError | RedisConnectionError)) \
                from exc

    async def _list_for_work(self, world: str, token: str) -> None:
        """Put `world` into the work index under the intent `token` (which the append then checks)."""
        await self._run(self._intent_script, [self._key(world, "intent"), self._key(world, "unlisting")],
                        [token, MARK_TTL_MS])
        await self._read("ZADD", self._work_key, 0, world)
        if self.on_listed is not None:
            self.on_listed(world)

    async def worlds_with_work(self) -> list[str]:
        return list(await self._read("ZRANGE", self._work_key, 0, -1))

    async def unlist_if_idle(self, world: str) -> bool:
        # 1. idle and no intent: mark the release; 2. out of the index; 3. unless an append or an intent
        # called the release off meanwhile (then back into the index, as it was).
        token = secrets.token_hex(8)
        unlisting = self._key(world, "unlisting")
        if not await self._run(self._unlist_begin, [self._key(world, "openlex"), self._key(world, "intent"),
                                                    unlisting], [token, MARK_TTL_MS, *_WORK_LEX]):
            return False
        await self._read("ZREM", self._work_key, world)
        if await self._run(self._unlist_end, [unlisting, self._key(world, "listed")], [token]):
            return True
        await self._read("ZADD", self._work_key, 0, world)
        return False

    async def _send_appends(self, batch: list[Pending]) -> list[object]:
        if self._append_script is None:
            raise RuntimeError(_NOT_OPEN)
        return await send_appends(self._r, self._wire, self._append_script, self._world_keys, self._tag_key, batch)

    def _world_keys(self, world: str) -> list[str]:
        keys = self._world_keys_of.get(world)
        if keys is None:  # named once, not five times per world per flush
            if len(self._world_keys_of) >= 4096:
                self._world_keys_of.clear()
            keys = self._world_keys_of[world] = [self._key(world, s) for s in (
                "seq", "events", "open", "openlex", "claims", "listed", "unlisting", "intent")]
        return keys

    # -- reads -------------------------------------------------------------------
    async def _read(self, *command: Any) -> Any:
        """One read command's reply, sent in a pipeline with the reads made meanwhile."""
        if self._client is None:
            raise RuntimeError(_NOT_OPEN)
        try:
            return await self._reads.call(command)
        except (RedisError, OSError) as exc:
            raise storage_error(exc) from exc

    async def _send_reads(self, batch: list[tuple[Any, ...]]) -> list[object]:
        replies: list[object]
        if self._read_wire is None:  # a cluster: its pipeline sends each command to its slot's node
            async with self._r.pipeline(transaction=False) as pipe:
                for command in batch:
                    pipe.execute_command(*command)
                replies = list(await pipe.execute(raise_on_error=False))
        else:
            replies = await self._read_wire.send(batch)
        for n, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # Redis lost its scripts (a restart, a new node): load, run again
                _, sha, count, *rest = batch[n]
                script = next(s for s in self._scripts() if s.sha == sha)
                try:
                    replies[n] = await script(keys=rest[:count], args=rest[count:])
                except RedisError as exc:
                    replies[n] = exc
        return replies

    def _scripts(self) -> list[AsyncScript]:
        return [s for s in (self._read_script, self._lease_script, self._release_script, self._intent_script,
                            self._unlist_begin, self._unlist_end) if s is not None]

    async def _run(self, script: AsyncScript | None, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """`script`'s reply, with the reads made meanwhile: one round trip on a single server, one pipeline
        on a cluster (not a connection per call: a node's pool refuses its 101st)."""
        if script is None:
            raise RuntimeError(_NOT_OPEN)
        return await self._read("EVALSHA", script.sha, len(keys), *keys, *args)

    async def _events(self, world: str, seqs: Sequence[int]) -> list[Event]:
        """The events with these seqs, in the given order (seqs no longer present are skipped)."""
        if not seqs:
            return []
        bodies = await self._read("HMGET", self._key(world, "events"), *seqs)
        return await finish([decoded(seq, body) for seq, body in zip(seqs, bodies, strict=True) if body is not None])

    async def read(self, world: str, after: int = 0, limit: int = 1000) -> list[Event]:
        last = await self.last_seq(world)
        stop = last if limit < 0 else min(last, after + limit)
        return await self._events(world, range(max(after, 0) + 1, stop + 1))

    async def read_tagged(self, world: str, tags: Sequence[str], after: int = 0,
                          limit: int | None = None, newest: bool = False) -> list[Event]:
        count = None if limit is None or limit < 0 else limit  # negative: no limit, as in SQL
        if not tags or count == 0:
            return []
        # Each tag's page holds that tag's first (or last) `count`, so the merged first (or last)
        # `count` are among them; an event with several of the tags is counted once (the script).
        tag_keys = [self._tag_key(world, tag) for tag in dict.fromkeys(tags)]
        return await in_order(await self._run(self._read_script, [*self._key_pair(world), *tag_keys],
                                        ["tagged", after, -1 if count is None else count, "1" if newest else "0"]))

    async def search_between(self, world: str, needle: str, low: int, high: int) -> tuple[list[Event], int]:
        # A bounded scan inside Redis (one script call per step, of at most `search_chunk` events and
        # `search_step_bytes` bytes, so none holds Redis long); only the events that hold the needle come
        # back. Redis has no text index here (no RediSearch).
        reply = await self._run(self._read_script, self._key_pair(world),
                                ["search", needle, low, high, self.search_step_bytes])
        return await in_order(reply[1:]), int(reply[0])

    async def get_open_many(self, world: str, keys: Sequence[str]) -> dict[str, Event]:
        if not keys:
            return {}
        return await by_key(await self._run(self._read_script, self._key_pair(world), ["keys", *keys]))

    def _key_pair(self, world: str) -> list[str]:
        return [self._key(world, "events"), self._key(world, "open")]

    async def list_open(self, world: str, prefix: str) -> list[Event]:
        # Redis orders this set by raw bytes, as SQLite orders TEXT; UTF-8 never contains 0xff,
        # so `prefix + 0xff` bounds every key that starts with `prefix`.
        low: bytes | str = b"[" + prefix.encode() if prefix else "-"
        high: bytes | str = b"[" + prefix.encode() + b"\xff" if prefix else "+"
        found = await by_key(await self._run(self._read_script, [*self._key_pair(world), self._key(world, "openlex")],
                                       ["prefix", low, high]))
        # One event may open several keys.
        return sorted({event["seq"]: event for event in found.values()}.values(), key=lambda e: e["seq"])

    async def is_claimed(self, world: str, key: str) -> bool:
        return bool(await self._read("SISMEMBER", self._key(world, "claims"), key))

    async def last_seq(self, world: str) -> int:
        value = await self._read("GET", self._key(world, "seq"))
        return int(value) if value is not None else 0

    async def worlds(self, after: str = "", limit: int | None = None) -> list[str]:
        page = () if limit is None else ("LIMIT", 0, limit)
        return list(await self._read("ZRANGEBYLEX", self._worldlex_key, f"({after}" if after else "-", "+", *page))

    # -- leases ------------------------------------------------------------------
    def _lease_keys(self, name: str, world: str | None) -> tuple[str, str]:
        """The lease's key and its fencing token's key, in the world's slot when it has one."""
        if world is None:
            return f"{{{self._prefix}}}:lease:{escape_name(name)}", f"{{{self._prefix}}}:fence:{escape_name(name)}"
        return self._key(world, f"lease:{escape_name(name)}"), self._key(world, f"fence:{escape_name(name)}")

    async def lease(self, name: str, holder: str, ttl: float, *, world: str | None = None,
                    mark: bool = False) -> int:
        return int(await self._run(self._lease_script, self._lease_keys(name, world),
                                   [holder, max(1, int(ttl * 1000)), "1" if mark else "0"]))

    async def release(self, name: str, holder: str, *, world: str | None = None, mark: bool = False) -> None:
        await self._run(self._release_script, self._lease_keys(name, world), [holder, "1" if mark else "0"])

    async def lease_holder(self, name: str, *, world: str | None = None) -> str | None:
        value = await self._read("GET", self._lease_keys(name, world)[0])
        return value.decode() if isinstance(value, bytes) else value

    async def close(self) -> None:
        await self._appends.close(ConnectionError("the Redis log was closed"))
        await self._reads.close(ConnectionError("the Redis log was closed"))
        for wire in (self._wire, self._read_wire):
            if wire is not None:
                await wire.close()
        if self._client is not None:
            client, self._client, self._append_script = self._client, None, None
            await client.aclose()
