"""The Lua scripts of ``RedisDirectory`` (server/cluster/directory/redis.py): one per
operation that reads and then writes, so that each is atomic. Every script starts with
``PRELUDE``, its shared helpers; ARGV[1] is always the key base.
"""

# Shared Lua helpers; ARGV[1] is always the key base.
PRELUDE = """
local base = ARGV[1]
local function wkey(id) return base .. ':worker:' .. id end
local function akey(id) return base .. ':alive:' .. id end
local function skey(id) return base .. ':worker-sessions:' .. id end
local function sesskey(sid) return base .. ':session:' .. sid end
local function hkey(sid) return base .. ':handover:' .. sid end
local function hskey(id) return base .. ':worker-handovers:' .. id end
local function orphan(id, now, ttl_ms)
  local out = {}
  for _, sid in ipairs(redis.call('SMEMBERS', skey(id))) do
    local k = sesskey(sid)
    if redis.call('HGET', k, 'worker_id') == id then
      redis.call('HSET', k, 'state', 'orphaned', 'updated', now)
      redis.call('PEXPIRE', k, ttl_ms)
      redis.call('DEL', hkey(sid))
      out[#out + 1] = sid
    end
  end
  redis.call('DEL', skey(id), hskey(id))
  table.sort(out)
  return out
end
-- The session stops being a handover on worker id (resumed, moved, released, orphaned).
local function settle(id, sid)
  redis.call('SREM', hskey(id), sid)
  redis.call('DEL', hkey(sid))
end
-- A handover on worker id whose key expired: orphan the session (it gives the slot back
-- and its record lapses). Returns 1 if it did.
local function expire_handover(id, sid, now, ttl_ms)
  local k = sesskey(sid)
  local rec = redis.call('HMGET', k, 'worker_id', 'state')
  if rec[1] ~= id or (rec[2] ~= 'migrating' and rec[2] ~= 'reserved') then  -- not held here any more
    redis.call('SREM', hskey(id), sid)
    return 0
  end
  if redis.call('EXISTS', hkey(sid)) == 1 then return 0 end
  redis.call('SREM', hskey(id), sid)
  redis.call('SREM', skey(id), sid)
  if rec[2] == 'reserved' then  -- a reservation nobody claimed: gone
    redis.call('DEL', k)
    return 1
  end
  redis.call('HSET', k, 'state', 'orphaned', 'updated', now)
  redis.call('PEXPIRE', k, ttl_ms)
  return 1
end
local function expire_handovers(id, now, ttl_ms)
  for _, sid in ipairs(redis.call('SMEMBERS', hskey(id))) do
    expire_handover(id, sid, now, ttl_ms)
  end
end
local function remove_worker(id, now, ttl_ms)
  local out = orphan(id, now, ttl_ms)
  redis.call('DEL', wkey(id), akey(id))
  redis.call('SREM', base .. ':workers', id)
  return out
end
"""

# ARGV: base, id, address, state, capacity, load, utilisation, now, ttl_ms, instance,
#   orphan_ttl_ms, signature. A record of another instance (the process restarted within its TTL):
#   its sessions are orphaned first, since that process took them with it.
REGISTER = """
local id = ARGV[2]
if redis.call('EXISTS', wkey(id)) == 1 and (redis.call('HGET', wkey(id), 'instance') or '') ~= ARGV[10] then
  orphan(id, ARGV[8], ARGV[11])
end
redis.call('DEL', wkey(id))
redis.call('HSET', wkey(id), 'address', ARGV[3], 'state', ARGV[4], 'capacity', ARGV[5],
           'load', ARGV[6], 'utilisation', ARGV[7], 'heartbeat', ARGV[8], 'instance', ARGV[10],
           'signature', ARGV[12])
redis.call('SET', akey(id), '1', 'PX', ARGV[9])
redis.call('SADD', base .. ':workers', id)
return 1
"""

# ARGV: base, id, load, utilisation, state, now, ttl_ms -> 1, or 0 if unknown
HEARTBEAT = """
local id = ARGV[2]
if redis.call('EXISTS', wkey(id)) == 0 then return 0 end
redis.call('HSET', wkey(id), 'load', ARGV[3], 'utilisation', ARGV[4], 'state', ARGV[5],
           'heartbeat', ARGV[6])
redis.call('SET', akey(id), '1', 'PX', ARGV[7])
return 1
"""

# ARGV: base, id, state -> 1, or 0 if unknown
SET_STATE = """
if redis.call('EXISTS', wkey(ARGV[2])) == 0 then return 0 end
redis.call('HSET', wkey(ARGV[2]), 'state', ARGV[3])
return 1
"""

# ARGV: base, id, now, orphan_ttl_ms -> orphaned session ids
DEREGISTER = "return remove_worker(ARGV[2], ARGV[3], ARGV[4])"
ORPHAN = "return orphan(ARGV[2], ARGV[3], ARGV[4])"

# ARGV: base, now, orphan_ttl_ms -> {id1, {sids...}, id2, {sids...}, ...}
REAP = """
local out = {}
local ids = redis.call('SMEMBERS', base .. ':workers')
table.sort(ids)
for _, id in ipairs(ids) do
  if redis.call('EXISTS', akey(id)) == 0 then
    out[#out + 1] = id
    out[#out + 1] = remove_worker(id, ARGV[2], ARGV[3])
  else
    expire_handovers(id, ARGV[2], ARGV[3])
  end
end
return out
"""

# ARGV: base, now, orphan_ttl_ms[, id] -> {id, placed, {hash...}, ...} for live workers
LIST = """
local ids
if ARGV[4] then ids = {ARGV[4]} else ids = redis.call('SMEMBERS', base .. ':workers') end
table.sort(ids)
local out = {}
for _, id in ipairs(ids) do
  if redis.call('EXISTS', akey(id)) == 1 and redis.call('EXISTS', wkey(id)) == 1 then
    expire_handovers(id, ARGV[2], ARGV[3])
    out[#out + 1] = id
    out[#out + 1] = redis.call('SCARD', skey(id))
    out[#out + 1] = redis.call('HGETALL', wkey(id))
  end
end
return out
"""

# ARGV: base, sid, threshold, now, orphan_ttl_ms, reserve_ms ('' none), among ('' any, else
#   ids joined by NUL; a lone NUL: none) -> {1, id, placed, {hash...}} or {0, live, serving}
PLACE = """
local sid, threshold, now = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local ids = redis.call('SMEMBERS', base .. ':workers')
local among = nil
if ARGV[7] ~= '' then
  among = {}
  for id in string.gmatch(ARGV[7], '[^%z]+') do among[id] = true end
end
table.sort(ids)
local best, best_frac, best_util
local live, serving = 0, 0
for _, id in ipairs(ids) do
  if redis.call('EXISTS', akey(id)) == 1 then
    live = live + 1
    expire_handovers(id, now, ARGV[5])
    local w = redis.call('HMGET', wkey(id), 'state', 'capacity', 'load', 'utilisation')
    if w[1] == 'serving' and (among == nil or among[id]) then
      serving = serving + 1
      local cap, util = tonumber(w[2]), tonumber(w[4])
      local load = math.max(tonumber(w[3]), redis.call('SCARD', skey(id)))
      if load < cap and util < threshold then
        local frac = load / cap
        if best == nil or frac < best_frac or (frac == best_frac and util < best_util) then
          best, best_frac, best_util = id, frac, util
        end
      end
    end
  end
end
if best == nil then return {0, live, serving} end
local k = sesskey(sid)
local old = redis.call('HGET', k, 'worker_id')
if old then
  redis.call('SREM', skey(old), sid)
  settle(old, sid)
end
redis.call('SADD', skey(best), sid)
local state = 'active'
if ARGV[6] ~= '' then state = 'reserved' end
redis.call('HSET', k, 'worker_id', best, 'epoch', redis.call('HGET', k, 'epoch') or '0',
           'block_idx', redis.call('HGET', k, 'block_idx') or '0', 'state', state,
           'updated', now)
redis.call('PERSIST', k)
if ARGV[6] ~= '' then  -- a reservation: held like a handover, deleted if nobody claims it
  redis.call('SADD', hskey(best), sid)
  redis.call('SET', hkey(sid), '1', 'PX', ARGV[6])
end
return {1, best, redis.call('SCARD', skey(best)), redis.call('HGETALL', wkey(best))}
"""

# ARGV: base, sid, worker_id, now, orphan_ttl_ms -> 1 claimed, 0 nothing to claim
CLAIM = """
local sid, k = ARGV[2], sesskey(ARGV[2])
local wid = redis.call('HGET', k, 'worker_id')
if not wid then return 0 end
if redis.call('SISMEMBER', hskey(wid), sid) == 1 then expire_handover(wid, sid, ARGV[4], ARGV[5]) end
if wid ~= ARGV[3] or redis.call('HGET', k, 'state') ~= 'reserved' then return 0 end
redis.call('HSET', k, 'state', 'active', 'updated', ARGV[4])
settle(wid, sid)
return 1
"""

# ARGV: base, sid -> 1, or 0 if unknown
RELEASE = """
local k = sesskey(ARGV[2])
local wid = redis.call('HGET', k, 'worker_id')
if not wid then return 0 end
redis.call('SREM', skey(wid), ARGV[2])
settle(wid, ARGV[2])
redis.call('DEL', k)
return 1
"""

# ARGV: base, sid, now, orphan_ttl_ms -> the record's hash (empty if unknown)
GET = """
local k = sesskey(ARGV[2])
local wid = redis.call('HGET', k, 'worker_id')
if wid and redis.call('SISMEMBER', hskey(wid), ARGV[2]) == 1 then
  expire_handover(wid, ARGV[2], ARGV[3], ARGV[4])
end
return redis.call('HGETALL', k)
"""

# ARGV: base, sid, worker_id, epoch, block_idx, state, now, orphan_ttl_ms, handover_ttl_ms,
#   token_hash ('' keeps the stored one) -> {1} | {0} unknown | {-1, wid}
UPDATE = """
local sid, k = ARGV[2], sesskey(ARGV[2])
local wid = redis.call('HGET', k, 'worker_id')
if not wid then return {0} end
if wid ~= ARGV[3] then return {-1, wid} end
redis.call('HSET', k, 'epoch', ARGV[4], 'block_idx', ARGV[5], 'state', ARGV[6],
           'updated', ARGV[7])
if ARGV[10] ~= '' then redis.call('HSET', k, 'token_hash', ARGV[10]) end
if ARGV[6] ~= 'orphaned' and redis.call('EXISTS', wkey(wid)) == 1 then
  redis.call('SADD', skey(wid), sid)
  redis.call('PERSIST', k)
  if ARGV[6] == 'migrating' then  -- handed over: the slot is held for a while
    redis.call('SADD', hskey(wid), sid)
    redis.call('SET', hkey(sid), '1', 'PX', ARGV[9])
  else
    settle(wid, sid)
  end
else  -- orphaned, or its worker is gone: the record lapses
  redis.call('SREM', skey(wid), sid)
  settle(wid, sid)
  redis.call('PEXPIRE', k, ARGV[8])
end
return {1}
"""

# ARGV: base, sid, worker_id, epoch, block_idx, now, token_hash, orphan_ttl_ms
#   -> 1 written, 0 the session has a record
RECREATE = """
local sid, k, wid = ARGV[2], sesskey(ARGV[2]), ARGV[3]
if redis.call('EXISTS', k) == 1 then return 0 end
redis.call('HSET', k, 'worker_id', wid, 'epoch', ARGV[4], 'block_idx', ARGV[5], 'state', 'active',
           'updated', ARGV[6])
if ARGV[7] ~= '' then redis.call('HSET', k, 'token_hash', ARGV[7]) end
if redis.call('EXISTS', wkey(wid)) == 1 then
  redis.call('SADD', skey(wid), sid)
else
  redis.call('PEXPIRE', k, ARGV[8])
end
return 1
"""
