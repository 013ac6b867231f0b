"""The Lua scripts of the Redis store (farm.store.redis_store): each of its atomic steps (a use, a put's commit, an
admission, a delete, an eviction batch, pins, refs, its stats) runs as one script, so that the header, the chunks and
the byte count change together whoever writes or deletes. Beside each script, the function that reads its reply:
redis-py hands a script's reply over untyped, and the shape each script returns is known (a fixed-length reply, a
list on the wire, is typed as a tuple; strings are bytes, as the store's clients leave decode_responses off).
"""

from typing import cast

# Every script gets the store's prefix as ARGV[1] and the cap this process defaults to as ARGV[2], and builds its
# key names from the prefix (one Redis server, no cluster: the farm's Celery transport needs one anyway).
COMMON = """
if redis.replicate_commands then redis.replicate_commands() end
local prefix = ARGV[1]
local LRU, SIZES, BYTES, PINS = prefix .. 'lru', prefix .. 'sizes', prefix .. 'bytes', prefix .. 'pins'
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function cap() return tonumber(redis.call('GET', prefix .. 'max_bytes') or ARGV[2]) end
local function total() return tonumber(redis.call('GET', BYTES) or '0') end
local function header_key(key) return prefix .. 'obj:' .. key end
local function account(key, size, now)
  if redis.call('HSETNX', SIZES, key, size) == 1 then redis.call('INCRBY', BYTES, size) end
  redis.call('ZADD', LRU, now, key)
end
local function touch(key, now)
  local header = redis.call('GET', header_key(key))
  if not header then return 0 end
  local size = tonumber(string.match(header, '^(%d+):'))
  if size then account(key, size, now) end
  return 1
end
local function drop(key)
  local header = redis.call('GETDEL', header_key(key))
  local count = header and tonumber(string.match(header, ':(%d+)$')) or 0
  for i = 0, count - 1 do redis.call('UNLINK', header_key(key) .. ':' .. i) end
  while redis.call('UNLINK', header_key(key) .. ':' .. count) == 1 do count = count + 1 end
  local backrefs = prefix .. 'backrefs:' .. key
  for _, member in ipairs(redis.call('SMEMBERS', backrefs)) do
    local target, name = key, member
    local bar = string.find(member, '|', 1, true)
    if bar then target, name = string.sub(member, 1, bar - 1), string.sub(member, bar + 1) end
    if redis.call('GET', prefix .. 'ref:' .. name) == target then redis.call('DEL', prefix .. 'ref:' .. name) end
  end
  redis.call('DEL', backrefs)
  local size = redis.call('HGET', SIZES, key)
  if size then
    redis.call('HDEL', SIZES, key)
    redis.call('DECRBY', BYTES, size)
  end
  redis.call('ZREM', LRU, key)
  return tonumber(size) or 0
end
local function live_owners()
  redis.call('ZREMRANGEBYSCORE', PINS, '-inf', '(' .. now_ms())
  return redis.call('ZRANGE', PINS, 0, -1)
end
local function pinned(key, owners)
  for _, owner in ipairs(owners) do
    if redis.call('SISMEMBER', prefix .. 'pin:' .. owner, key) == 1 then return true end
  end
  return false
end
local function add_members(set, first)
  for i = first, #ARGV, 1000 do redis.call('SADD', set, unpack(ARGV, i, math.min(i + 999, #ARGV))) end
end
"""

TOUCH = COMMON + "return {touch(ARGV[3], now_ms()), total(), cap()}"
"""A use of an entry: {1 and the entry marked used now (counted, if an older farm wrote it), or 0 when absent;
the entries' bytes; the cap}."""


def flag_bytes_cap(reply: object) -> tuple[int, int, int]:
    """The reply of TOUCH, COMMIT or PROMOTE: (the script's flag, the entries' bytes, the cap)."""
    return cast("tuple[int, int, int]", reply)


WHOLE = (
    COMMON
    + """
local now, found = now_ms(), {}
for i = 3, #ARGV do
  local key, state = ARGV[i], -1
  local header = redis.call('GET', header_key(key))
  local size, count = nil, nil
  if header then size, count = string.match(header, '^(%d+):(%w+)$') end
  if size and count == 'file' then
    state = tonumber(size)
  elseif size and tonumber(count) then
    local held = 0
    for c = 0, tonumber(count) - 1 do held = held + redis.call('STRLEN', header_key(key) .. ':' .. c) end
    if held == tonumber(size) then state = -2 end
  end
  if state ~= -1 then account(key, tonumber(size), now) end
  found[#found + 1] = state
end
return found
"""
)
"""Whether each entry (ARGV[3:]) is whole, judged by lengths without reading its bytes, each whole one marked used:
-1 not whole (no header, or its chunks don't add up to its size), -2 whole in chunks, or the size of the blob
store's file that holds it (the caller checks the file)."""


def whole_states(reply: object) -> list[int]:
    """The reply of WHOLE: each entry's state (-1, -2 or the blob store's size), in the order of the keys."""
    return cast("list[int]", reply)


COMMIT = (
    COMMON
    + """
for i = 0, (tonumber(ARGV[5]) or 0) - 1 do
  if redis.call('EXISTS', header_key(ARGV[3]) .. ':' .. i) == 0 then return {0, total(), cap()} end
end
redis.call('SET', header_key(ARGV[3]), ARGV[4] .. ':' .. ARGV[5])
account(ARGV[3], tonumber(ARGV[4]), now_ms())
return {1, total(), cap()}
"""
)
"""The last step of a put: the header (which makes the entry exist) and its accounting, at once, but only when
every chunk is there (a concurrent delete of the same key may have swept them): {1 or 0, bytes, cap}. A count of
`file` (FILE_CHUNKS) is an entry whose bytes are a file of the blob store, written before."""

PROMOTE = (
    COMMON
    + """
local key, staged, size, count = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
if redis.call('EXISTS', header_key(key)) == 1 then return {2, total(), cap()} end
for i = 0, count - 1 do
  if redis.call('EXISTS', staged .. ':' .. i) == 0 then return {0, total(), cap()} end
end
for i = 0, count - 1 do
  local chunk = header_key(key) .. ':' .. i
  redis.call('RENAME', staged .. ':' .. i, chunk)
  redis.call('PERSIST', chunk)
end
redis.call('DEL', staged)
redis.call('SET', header_key(key), size .. ':' .. count)
account(key, tonumber(size), now_ms())
return {1, total(), cap()}
"""
)
"""Admit staged bytes that were read and checked: their chunks renamed into the entry's (the bytes never leave
Redis, nor are they held twice), then the header and the accounting, at once: {1, bytes, cap}; {2, ...} when the
entry exists already (the staged copy is dropped by the caller), {0, ...} when a staged chunk is gone."""

DROP = COMMON + "return drop(ARGV[3])"
"""Delete an entry: header first, its chunks (a dead put's orphans too), the refs that point at it, its bytes."""

EVICT = (
    COMMON
    + """
local now, limit, most = now_ms(), cap() - tonumber(ARGV[4]), tonumber(ARGV[3])
local owners, left = live_owners(), total()
local entries, freed, dropped = 0, 0, {}
while left > limit and entries < most do
  local batch = redis.call('ZRANGEBYSCORE', LRU, '-inf', now, 'LIMIT', 0, 100)
  if #batch == 0 then break end
  for _, key in ipairs(batch) do
    if left <= limit or entries >= most then break end
    if pinned(key, owners) then
      redis.call('ZADD', LRU, now + 1, key)
    else
      local size = drop(key)
      left, freed, entries = left - size, freed + size, entries + 1
      dropped[#dropped + 1] = key
    end
  end
end
return {entries, freed, left, (left > limit and entries >= most) and 1 or 0, dropped}
"""
)
"""One batch of eviction, least recently used first, until the bytes are within the cap less ARGV[4] (room for a
put about to write): {entries, bytes freed, bytes left, 1 when the batch limit stopped it above that, the keys
dropped (whose files a blob store then deletes)}. A pinned
entry is in use: it is marked used now, so that the next eviction doesn't walk over it again (long-pinned
entries, such as tuning records, would otherwise sit at the old end and be checked by every put)."""


def eviction_batch(reply: object) -> tuple[int, int, int, int, list[bytes]]:
    """The reply of EVICT: (entries dropped, bytes freed, bytes left, 1 when the batch limit stopped it, their keys)."""
    return cast("tuple[int, int, int, int, list[bytes]]", reply)


PIN = (
    COMMON
    + """
local set = prefix .. 'pin:' .. ARGV[3]
if ARGV[5] == '1' then redis.call('DEL', set) end
add_members(set, 6)
if redis.call('EXISTS', set) == 0 then
  redis.call('ZREM', PINS, ARGV[3])
elseif ARGV[4] == '' then
  redis.call('PERSIST', set)
  redis.call('ZADD', PINS, 'inf', ARGV[3])
else
  redis.call('PEXPIRE', set, ARGV[4])
  redis.call('ZADD', PINS, now_ms() + tonumber(ARGV[4]), ARGV[3])
end
return 1
"""
)
"""Pin keys for an owner (ARGV: owner, ttl in ms or '' for none, '1' to replace its pins, keys...)."""

UNPIN = (
    COMMON
    + """
local set = prefix .. 'pin:' .. ARGV[3]
if #ARGV == 3 then
  redis.call('DEL', set)
else
  for i = 4, #ARGV, 1000 do redis.call('SREM', set, unpack(ARGV, i, math.min(i + 999, #ARGV))) end
end
if redis.call('EXISTS', set) == 0 then redis.call('ZREM', PINS, ARGV[3]) end
return 1
"""
)

OWNERS = COMMON + "return live_owners()"


def owner_names(reply: object) -> list[bytes]:
    """The reply of OWNERS: the owners whose pins are live."""
    return cast("list[bytes]", reply)


STATS = (
    COMMON
    + """
local owners, seen, entries, bytes = live_owners(), {}, 0, 0
for _, owner in ipairs(owners) do
  for _, key in ipairs(redis.call('SMEMBERS', prefix .. 'pin:' .. owner)) do
    if not seen[key] then
      seen[key] = true
      local size = redis.call('HGET', SIZES, key)
      if size then entries, bytes = entries + 1, bytes + tonumber(size) end
    end
  end
end
return {redis.call('HLEN', SIZES), total(), cap(), entries, bytes, owners}
"""
)
"""Entries, bytes, cap, pinned entries and bytes (each entry once, however many owners pin it), live owners."""


def stats_counts(reply: object) -> tuple[int, int, int, int, int, list[bytes]]:
    """The reply of STATS: (entries, bytes, cap, pinned entries, pinned bytes, live owners)."""
    return cast("tuple[int, int, int, int, int, list[bytes]]", reply)


SET_REF = (
    COMMON
    + """
redis.call('SET', prefix .. 'ref:' .. ARGV[3], ARGV[4])
local member = ARGV[3]
if ARGV[5] ~= ARGV[4] then member = ARGV[4] .. '|' .. ARGV[3] end
if redis.call('EXISTS', header_key(ARGV[5])) == 1 then redis.call('SADD', prefix .. 'backrefs:' .. ARGV[5], member) end
return 1
"""
)
"""Point a ref at a key and remember it beside the anchor's entry (the key's, or the weight a packed weight is made
from, as `<key>|<name>`), so that evicting that entry deletes the ref too, unless it was pointed elsewhere since
(refs stay as bounded as the entries)."""

ADOPT = (
    COMMON
    + """
local adopted = 0
for i = 3, #ARGV do
  if redis.call('HEXISTS', SIZES, ARGV[i]) == 0 then
    local header = redis.call('GET', header_key(ARGV[i]))
    local size = header and tonumber(string.match(header, '^(%d+):'))
    if size then
      account(ARGV[i], size, 0)
      adopted = adopted + 1
    end
  end
end
return adopted
"""
)
"""Count entries that an older farm wrote without accounting, as the least recently used of all."""


def adopted_count(reply: object) -> int:
    """The reply of ADOPT: how many entries it counted."""
    return cast(int, reply)
