"""How appends reach Redis: every append queued meanwhile goes in one Lua call.

Concurrent appends are gathered (`Pipelined`) and become one call of the append script: one for
all worlds on a single server, one per world on a Redis Cluster (a script's keys must share a
slot; the calls then go concurrently). Inside the script each append is still its own
all-or-nothing unit, with its own receipt and result: batching changes round trips, not semantics.
The structure of a call travels as one JSON argument and each event's JSON as one more, so a
call costs Redis and redis-py a few arguments, not a dozen per event.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from ..base import Claim, Close, Fence, Op, Open, Tag
from .wire import Wire

# The append script. Per append: its receipt is checked (a retried append finds it and writes
# nothing), then its conditions, op by op, as if the ops before each one had already been applied
# (so [Close(k), Open(k)] passes and [Claim(k), Claim(k)] does not, exactly as in the SQLite log);
# only when all hold does it take seqs and write anything.
APPEND_LUA = """
-- KEYS: per world, from its index w: KEYS[w] seq counter, KEYS[w+1] events hash, KEYS[w+2] open hash,
--   KEYS[w+3] open-lex zset, KEYS[w+4] claims set, KEYS[w+5] `listed` (the world is in the work index),
--   KEYS[w+6] `unlisting` (a release under way), KEYS[w+7] `intent` (a process is putting it in);
--   then the appends' receipts, the tags' zsets,
--   the fencing tokens
-- ARGV[1] JSON, one entry per append: [receipt KEYS index, its world's index w, events, work, token]:
--   work 0 (opens no work item), 1 (opens work: refused with {'unlisted', ''} unless the world is listed),
--   2 (opens work; the caller listed the world under the intent `token`, which must still be there); an event is
--   [ARGV index of its JSON, ops, KEYS indexes of its tags]; an op is [name, key], name in
--   open (must not be open) | reopen (replace) | close (must be open) | close? | claim,
--   or ['fence', lease, KEYS index of its token, token] (the token must be that); a close (or close?)
--   may have a third item, a seq: the key stays open if an event after that seq opened it
-- ARGV[2..] the events' JSON (without seq)
-- Returns one result per append: its first new seq, or {reason, key} (that append wrote nothing).

local function append(receipt_key, w, events, work, token)
  local receipt = redis.call('GET', receipt_key)
  if receipt then return tonumber(receipt) end

  local opened = {}   -- key -> true/false: open state as left by the ops checked so far
  local fresh = {}    -- key -> true: opened by an op of this append (its seq is after any seq read before)
  local claimed = {}  -- key -> true: claimed by an earlier op of this append
  local function is_open(key)
    local state = opened[key]
    if state == nil then
      state = redis.call('HEXISTS', KEYS[w + 2], key) == 1
    end
    return state
  end
  -- After a close with a seq: whether the key stays open (opened after that seq, maybe by this append).
  local function stays_open(key, after)
    if after == nil or not is_open(key) then return false end
    if fresh[key] then return true end
    return tonumber(redis.call('HGET', KEYS[w + 2], key)) > after
  end

  -- 1. Check every condition; return before writing anything if one fails.
  for _, e in ipairs(events) do
    for _, op in ipairs(e[2]) do
      local name, key = op[1], op[2]
      if name == 'open' then
        if is_open(key) then return {'open', key} end
        opened[key], fresh[key] = true, true
      elseif name == 'reopen' then
        opened[key], fresh[key] = true, true
      elseif name == 'close' then
        if not is_open(key) then return {'closed', key} end
        opened[key] = stays_open(key, op[3])
      elseif name == 'close?' then
        opened[key] = stays_open(key, op[3])
      elseif name == 'claim' then
        if claimed[key] or redis.call('SISMEMBER', KEYS[w + 4], key) == 1 then
          return {'claimed', key}
        end
        claimed[key] = true
      elseif name == 'fence' then
        if redis.call('GET', KEYS[op[3]]) ~= op[4] then return {'fenced', key} end
      else
        error('unknown op ' .. name)
      end
    end
  end

  -- A work item may only open in a listed world (see RedisLog.append_batch); a release under way is
  -- called off below (RedisLog.unlist_if_idle then puts the world back).
  if work == 1 and redis.call('EXISTS', KEYS[w + 5]) == 0 then return {'unlisted', ''} end
  if work == 2 and redis.call('GET', KEYS[w + 7]) ~= token then return {'unlisted', ''} end

  -- 2. All conditions hold: take the next seqs, store the events, apply the ops in order.
  local first = nil
  for _, e in ipairs(events) do
    local seq = redis.call('INCR', KEYS[w])
    first = first or seq
    redis.call('HSET', KEYS[w + 1], seq, ARGV[e[1]])
    for _, op in ipairs(e[2]) do
      local name, key = op[1], op[2]
      if name == 'open' or name == 'reopen' then
        redis.call('HSET', KEYS[w + 2], key, seq)
        redis.call('ZADD', KEYS[w + 3], 0, key)
      elseif name == 'close' or name == 'close?' then
        local at = op[3] and redis.call('HGET', KEYS[w + 2], key)
        if not at or tonumber(at) <= op[3] then
          redis.call('HDEL', KEYS[w + 2], key)
          redis.call('ZREM', KEYS[w + 3], key)
        end
      elseif name == 'claim' then
        redis.call('SADD', KEYS[w + 4], key)
      end
    end
    for _, t in ipairs(e[3]) do
      redis.call('ZADD', KEYS[t], seq, seq)
    end
  end
  if work > 0 then
    redis.call('DEL', KEYS[w + 6])
    if work == 2 then redis.call('SET', KEYS[w + 5], '1'); redis.call('DEL', KEYS[w + 7]) end
  end
  redis.call('SET', receipt_key, first, 'PX', 60000)
  return first
end

local results = {}
for i, a in ipairs(cjson.decode(ARGV[1])) do
  results[i] = append(KEYS[a[1]], a[2], a[3], a[4], a[5])
end
return results
"""


@dataclass
class Pending:
    """One `append_batch`, ready for the script: its world, its receipt's key, and per event its
    JSON with its ops (as the script names them) and its tags. Fences name their token's key."""
    world: str
    receipt: str
    work: int = 0  # 0, 1 or 2, as the script takes it
    token: str = ""  # the intent under which the world was listed (work 2)
    events: list[tuple[bytes, list[list[str | int]], list[str], list[tuple[str, str, int]]]] = field(
        default_factory=list)


def encode_ops(ops: Sequence[Op]) -> tuple[list[list[str | int]], list[str], list[Fence]]:
    """The script's ops, the tags (deduplicated, in order) and the fences (named by the caller,
    who knows the token keys)."""
    out: list[list[str | int]] = []
    tags: dict[str, None] = {}
    fences: list[Fence] = []
    for op in ops:
        if isinstance(op, Tag):  # the commonest first: nearly every event carries tags
            tags[op.tag] = None
        elif isinstance(op, Fence):
            fences.append(op)
        elif isinstance(op, Open):
            out.append(["open" if op.new else "reopen", op.key])
        elif isinstance(op, Close):
            name = "close" if op.must_exist else "close?"
            out.append([name, op.key] if op.unless_reopened_after is None
                       else [name, op.key, op.unless_reopened_after])
        elif isinstance(op, Claim):
            out.append(["claim", op.key])
        else:
            raise TypeError(f"unknown op {op!r}")
    return out, list(tags), fences


def script_call(worlds: Sequence[tuple[list[str], Callable[[str], str], Sequence[Pending]]]
                ) -> tuple[list[str], list[bytes]]:
    """KEYS and ARGV of one script call running, per world, (its eight keys, its tag keys, its appends)."""
    keys: list[str] = []
    index: dict[str, int] = {}

    def at(key: str) -> int:  # the KEYS index of `key` (1-based, as Lua counts), added once
        if key not in index:
            keys.append(key)
            index[key] = len(keys)
        return index[key]

    spec: list[Any] = []
    bodies: list[bytes] = []
    tag_at: dict[tuple[int, str], int] = {}  # (world, tag): each tag's key named once per call, not per event

    def tag(w: int, tag_key: Callable[[str], str], t: str) -> int:
        found = tag_at.get((w, t))
        if found is None:
            found = tag_at[w, t] = at(tag_key(t))
        return found

    for world_keys, tag_key, appends in worlds:
        w = len(keys) + 1
        keys.extend(world_keys)  # distinct from any other key: never looked up by `at`
        for pending in appends:
            events: list[Any] = []
            for body, ops, tags, fences in pending.events:
                bodies.append(body)
                fenced = [["fence", lease, at(token_key), str(token)] for lease, token_key, token in fences]
                events.append([len(bodies) + 1, ops + fenced if fenced else ops, [tag(w, tag_key, t) for t in tags]])
            spec.append([at(pending.receipt), w, events, pending.work, pending.token])
    return keys, [orjson.dumps(spec), *bodies]  # bytes, as they go on the wire: never re-encoded


async def send_appends(client: Any, wire: Wire | None, script: AsyncScript, world_keys: Callable[[str], list[str]],
                       tag_key: Callable[[str, str], str], batch: list[Pending]) -> list[object]:
    """Run `batch` as one script call on `wire` (on a cluster, which has none: one per world, through
    `client`); one result per append, in order."""
    by_world: dict[str, list[int]] = {}
    for n, pending in enumerate(batch):
        by_world.setdefault(pending.world, []).append(n)
    groups = [(world_keys(world), partial(tag_key, world), [batch[n] for n in ns]) for world, ns in by_world.items()]
    cluster = wire is None
    # Each call: its KEYS and ARGV, and the batch's indexes of its appends (in the order of its results).
    calls = ([(*script_call([group]), ns) for group, ns in zip(groups, by_world.values(), strict=True)] if cluster
             else [(*script_call(groups), [n for ns in by_world.values() for n in ns])])
    replies: list[Any]
    if wire is None:  # its pipelines refuse EVALSHA, and a script's keys must share a slot: concurrent calls
        replies = await asyncio.gather(*(script(keys=keys, args=args) for keys, args, _ in calls),
                                       return_exceptions=True)
    else:
        replies = await wire.send([("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args, _ in calls])
    results: list[object] = [None] * len(batch)
    for (keys, args, ns), reply in zip(calls, replies, strict=True):
        if isinstance(reply, NoScriptError):  # not run: Redis lost its scripts (a restart)
            try:
                reply = await script(keys=keys, args=args)  # loads the script, then runs it
            except RedisError as exc:
                reply = exc
        for i, n in enumerate(ns):
            results[n] = reply if isinstance(reply, BaseException) else reply[i]
    return results
