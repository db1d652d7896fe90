"""The Redis log's reads of events by open key or by tag, each one round trip (a Lua script).

Such a read needs the seqs first (from the `open` hash, the `openlex` set or a tag's set), then the
events: two or three round trips in a row as plain commands, on the hot path of every approval and
every agent wake-up across processes. The script does both steps inside Redis. It only reads, and
names every key it touches, all of one world's hash slot (so it runs on Redis Cluster too).
"""
from __future__ import annotations

from collections.abc import Sequence

from ...vocab import Event
from ..codec import Large, decoded, finish, finish_opened

# KEYS[1] the world's `events`, KEYS[2] its `open`, KEYS[3..] per mode:
#   'keys'     ARGV[2..] open keys                     -> key, seq, body for each open one
#   'prefix'   KEYS[3] `openlex`, ARGV[2], ARGV[3] its lex range -> key, seq, body for each open one
#   'search'   ARGV[2] needle, ARGV[3] low, ARGV[4] high, ARGV[5] bytes -> reached, then seq, body of the
#              events that hold it, newest first, down from high to reached (bounded by the bytes)
#   'tagged'   KEYS[3..] tag sets, ARGV[2] after, ARGV[3] count (-1: all), ARGV[4] '1' for the newest
#              -> seq, body of the first (or last) `count` events carrying any of the tags, by seq
# Commands take their arguments in slices: Lua's unpack has a limit of a few thousand values.
READ_LUA = """
local SLICE = 1000
local function hmget(key, fields)
  local out = {}
  for i = 1, #fields, SLICE do
    local got = redis.call('HMGET', key, unpack(fields, i, math.min(i + SLICE - 1, #fields)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end
local mode = ARGV[1]
if mode == 'search' then
  -- ARGV[2] the needle (lowercase, as in the stored JSON), ARGV[3] low, ARGV[4] high, ARGV[5] a byte budget:
  -- going down from high, the events whose JSON, lowercased (ASCII), contains it (server/log/search.py),
  -- until low or until the bodies looked at reach the budget (at least one: sizes are read first, with
  -- HSTRLEN, so no body past it is even loaded). Replies `reached` (every seq above it was looked at),
  -- then seq, body of each hit, newest first.
  local needle, low, high, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local out, used, s, full = {0}, 0, high, false
  while s > low and not full do
    local seqs = {}  -- a slice of up to 100 seqs going down, as many as the budget has room for
    while s > low and #seqs < 100 do
      local size = redis.call('HSTRLEN', KEYS[1], s)
      if used > 0 and used + size > budget then full = true; break end
      used = used + size
      seqs[#seqs + 1] = s
      s = s - 1
    end
    if #seqs > 0 then
      local bodies = redis.call('HMGET', KEYS[1], unpack(seqs))
      for i = 1, #seqs do
        local body = bodies[i]
        if body and string.find(string.lower(body), needle, 1, true) then
          out[#out + 1] = seqs[i]; out[#out + 1] = body
        end
      end
    end
  end
  out[1] = s
  return out
end
if mode == 'tagged' then
  -- LIMIT takes ARGV[3] as sent: a Lua number (a double) past 1e17 would go as '1e+17', refused
  local after, count, newest = ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
  local page = count < 0 and {} or {'LIMIT', 0, ARGV[3]}
  local seen, seqs = {}, {}
  for k = 3, #KEYS do
    local members
    if newest then members = redis.call('ZREVRANGEBYSCORE', KEYS[k], '+inf', '(' .. after, unpack(page))
    else members = redis.call('ZRANGEBYSCORE', KEYS[k], '(' .. after, '+inf', unpack(page)) end
    for _, m in ipairs(members) do
      local seq = tonumber(m)
      if not seen[seq] then seen[seq] = true; seqs[#seqs + 1] = seq end
    end
  end
  table.sort(seqs)
  if count >= 0 and #seqs > count then
    local kept, from = {}, newest and (#seqs - count + 1) or 1
    for i = from, from + count - 1 do kept[#kept + 1] = seqs[i] end
    seqs = kept
  end
  local bodies = hmget(KEYS[1], seqs)
  local out = {}
  for i = 1, #seqs do
    if bodies[i] then out[#out + 1] = seqs[i]; out[#out + 1] = bodies[i] end
  end
  return out
end
local keys
if mode == 'prefix' then
  keys = redis.call('ZRANGEBYLEX', KEYS[3], ARGV[2], ARGV[3])
else
  keys = {}
  for i = 2, #ARGV do keys[#keys + 1] = ARGV[i] end
end
if #keys == 0 then return {} end
local seqs = hmget(KEYS[2], keys)
local found, wanted, seen = {}, {}, {}
for i = 1, #keys do
  if seqs[i] then
    found[#found + 1] = i
    if not seen[seqs[i]] then seen[seqs[i]] = true; wanted[#wanted + 1] = seqs[i] end
  end
end
local bodies, body_of = hmget(KEYS[1], wanted), {}
for i = 1, #wanted do body_of[wanted[i]] = bodies[i] end
local out = {}
for _, i in ipairs(found) do
  local body = body_of[seqs[i]]
  if body then out[#out + 1] = keys[i]; out[#out + 1] = seqs[i]; out[#out + 1] = body end
end
return out
"""


async def by_key(reply: Sequence[object]) -> dict[str, Event]:
    """A 'keys' or 'prefix' reply: each open key's event (one event may open several keys: decoded once)."""
    events: dict[int, Event | Large] = {}
    opened = []
    for i in range(0, len(reply), 3):
        seq = int(str(reply[i + 1]))
        if seq not in events:
            events[seq] = decoded(seq, str(reply[i + 2]))
        opened.append((str(reply[i]), seq))
    return await finish_opened(events, opened)


async def in_order(reply: Sequence[object]) -> list[Event]:
    """A 'tagged' reply (or a 'search' reply after its first value): its events, in the reply's order."""
    return await finish([decoded(int(str(reply[i])), str(reply[i + 1])) for i in range(0, len(reply), 2)])
