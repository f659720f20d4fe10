-- cluster.lua: the cluster modes (store/cluster.py, docs/cluster.md). On Redis Cluster a call's counters
-- may sit in several hash slots and its record in another, and one script can only
-- touch one slot; so the cluster store runs these steps, one script call per slot. They
-- have no Python twin (the embedded store never needs them); the cluster tests hold
-- them to the same conformance table as `decide`.
--
-- Each mode's KEYS, ARGV and reply are in limiter/script.py (Mode.CLAIM ... SETTLE_HOLDS).

local function claim()
  local call_id, fingerprint, nonce, ttl = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
  local record = redis.call('HMGET', KEYS[1], 'f', 'r', 's')
  if record[1] then
    if record[1] ~= fingerprint then return {3} end
    if record[3] == 'pending' then return {4} end
    if record[3] == 'settled' then return {5} end
    return recorded_numbers({2}, record[2])
  end
  redis.call('HSET', KEYS[1], 'f', fingerprint, 's', 'pending', 'p', nonce)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {0}
end

local function unclaim()
  if redis.call('HGET', KEYS[1], 'p') == ARGV[3] then redis.call('DEL', KEYS[1]) end
  return {0}
end

local function record()
  local nonce, fingerprint, numbers, holds = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
  local ttl, named = tonumber(ARGV[7]), ARGV[8] == '1'
  local found = redis.call('HMGET', KEYS[1], 'f', 'r', 's', 'p')
  if found[1] and found[4] ~= nonce then  -- our claim expired and another check took it
    if found[3] == 'pending' then return {4} end
    return recorded_numbers({2}, found[2])
  end
  if not named and holds == '' then
    if found[1] then redis.call('DEL', KEYS[1]) end
    return {0}
  end
  -- The nonce stays: a check interrupted after this write gives its call back and drops
  -- the record with 'unclaim', which deletes only a record bearing its nonce.
  redis.call('HSET', KEYS[1], 'f', fingerprint, 'r', numbers, 'h', holds, 's', 'open', 'p', nonce)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {0}
end

local function read_ops(first_arg, width)  -- one op per key; 'release' adds two undo tokens
  local ops = {}
  for i = 1, #KEYS do
    local a = first_arg + (i - 1) * width
    ops[i] = read_op(KEYS[i], a)
    ops[i].undo, ops[i].undo2 = tonumber(ARGV[a + 10]), tonumber(ARGV[a + 11])
  end
  return ops
end

local function group()
  local dry, call_id = ARGV[3] == '1', ARGV[4]
  local checks, blocked = {}, false
  for i, op in ipairs(read_ops(5, 10)) do
    op.undoable = true
    local c = EVALUATE[op.kind](op.key, op, call_id)
    c.op = op
    if op.role == 1 and not c.admitted then blocked = true end
    checks[i] = c
  end
  local reply = {blocked and 1 or 0}
  for _, c in ipairs(checks) do
    local committed = not dry and not blocked and consumes(c)
    if committed then c.commit() end
    if c.save then c.save() end
    for _, v in ipairs({c.admitted and 1 or 0, c.used, c.retry, c.reset, c.reserved or 0,
                        committed and 1 or 0, c.undo or 0, c.undo2 or 0}) do
      reply[#reply + 1] = v
    end
  end
  return reply
end

-- Release: the inverse of one commit. Each leaves the counter as if that commit had
-- never happened (an emptied counter is deleted, TTLs are those of what remains), and
-- never touches what later commits added.
local function sw_release(key, op)
  local s = redis.call('GET', key)
  if not s or #s <= HEADER then return end
  local capacity, head = dec(s, 1, 4), dec(s, 5, 4)
  local body = string.sub(s, HEADER + 1)
  local n = #body / ENTRY
  local ordered = string.sub(body, head * ENTRY + 1) .. string.sub(body, 1, head * ENTRY)
  local found = nil
  for j = n - 1, 0, -1 do  -- newest first: the stamp is almost always the newest entry
    local stamp = dec(ordered, j * ENTRY + 1, ENTRY)
    if stamp == op.undo then found = j break end
    if stamp < op.undo then break end  -- sorted: it is not there (a reload dropped it)
  end
  if not found then return end
  local rest = string.sub(ordered, 1, found * ENTRY) .. string.sub(ordered, (found + 1) * ENTRY + 1)
  if op.undo2 > 0 then  -- the commit overwrote the oldest entry: put it back, oldest
    rest = enc(op.undo2, ENTRY) .. rest
  end
  local newest = #rest > 0 and dec(rest, #rest - ENTRY + 1, ENTRY) or nil
  if not newest or newest + op.window <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, enc(capacity, 4) .. enc(0, 4) .. rest, 'PX', newest + op.window - now)
  end
end

local function tb_release(key, op)
  if op.limit == 0 then return end
  local tat = tonumber(redis.call('GET', key))
  if not tat then return end
  local back = tat - op.window / op.limit
  if back <= now then
    redis.call('DEL', key)  -- a TAT in the past is a full bucket, as no key is
  else
    redis.call('SET', key, string.format('%.17g', back), 'PX', math.max(1, math.ceil(back - now)))
  end
end

local function fw_release(key, op)
  local stored = redis.call('GET', key)
  if not stored then return end
  local s, n = string.match(stored, '^(%d+):(%d+)$')
  if tonumber(s) ~= op.undo then return end  -- that window is over: nothing to give back
  if tonumber(n) <= 1 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, s .. ':' .. int(tonumber(n) - 1), 'KEEPTTL')
  end
end

local function bg_release(key, op, call_id)
  if not redis.call('HGET', key, 'h:' .. call_id) then return end
  local b = budget_load(key, op.p0, op.p1, op.p2)
  local held = redis.call('HGET', key, 'h:' .. call_id)
  if held then  -- (budget_load may have charged it already, had it expired)
    b.r = b.r - tonumber(string.match(held, '^(%d+):'))
    redis.call('HDEL', key, 'h:' .. call_id)
    b.dirty = true
    if op.undo2 > 0 then  -- the commit replaced the call's earlier reservation: put it back
      redis.call('HSET', key, 'h:' .. call_id, int(op.undo) .. ':' .. int(op.undo2))
      b.r = b.r + op.undo
    end
  end
  if b.s == 0 and b.r == 0 then  -- nothing spent or reserved: as if never created
    redis.call('DEL', key)
    return
  end
  local fields, earliest = redis.call('HGETALL', key), nil
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == 'h:' then
      local expiry = tonumber(string.match(fields[i + 1], ':(%d+)$'))
      if not earliest or expiry < earliest then earliest = expiry end
    end
  end
  b.n, b.dirty = earliest, true
  budget_save(key, b, 0)
end

local function cc_release(key, op, call_id)
  redis.call('ZREM', key, call_id)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 0 or tonumber(last[2]) <= now then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, tonumber(last[2]) - now)  -- the latest lease's expiry
  end
end

local function tk_release() end  -- a token rate's check took nothing

local RELEASE = {sw = sw_release, tb = tb_release, fw = fw_release, bg = bg_release, cc = cc_release,
                 tk = tk_release}

local function release()
  local call_id = ARGV[3]
  local reply = {}
  for _, op in ipairs(read_ops(4, 12)) do
    RELEASE[op.kind](op.key, op, call_id)
    local c = EVALUATE[op.kind](op.key, op, call_id)
    for _, v in ipairs({c.admitted and 1 or 0, c.used, c.retry, c.reset, c.reserved or 0}) do
      reply[#reply + 1] = v
    end
  end
  return reply
end

local function settle_mark()
  local record = redis.call('HMGET', KEYS[1], 's', 'f')
  local state = record[1]
  if ARGV[3] ~= '' and record[2] ~= ARGV[3] then return {2} end  -- another call's record
  if state == 'settled' then return {1} end
  if state ~= 'open' then return {2} end
  redis.call('HSET', KEYS[1], 's', 'settled')
  return {0}
end

local function settle_holds()
  return settle_all(1, 7, ARGV[3], ARGV[4], ARGV[5], ARGV[6] == '1')
end
