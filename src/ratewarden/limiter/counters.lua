-- counters.lua: every atomic step on ratewarden's counters, one script call each.
--
--   decide: evaluate all counters of one call, then commit all or nothing
--   settle: replace a call's budget reservations by its actual cost, release its slots
--
-- The pure-Python twin is limiter/reference.py; the conformance tests hold the two to
-- the same answers, so a change to one must be mirrored in the other. Times are ms
-- since the epoch, money is integer micro-units.
--
-- decide  KEYS[1] the call's record, KEYS[1+i] the counter of op i
--         ARGV: 'decide', now ('' = Redis TIME), dry ('1' = report only), call_id,
--               fingerprint, record TTL, keep ('1' = record even without holds), then
--               ten values per op: kind (sw|tb|fw|bg|cc), role (0 shadow, 1 enforce,
--               2 forced), limit, window, burst, cost, period start, period end,
--               next period's end, hold line (recorded when a bg/cc op commits)
--         returns {status, then per op: admitted, used, retry, reset, reserved}
--               status 0 allowed, 1 blocked, 2 replayed from the record, 3 call_id
--               conflict; retry = -1 when waiting does not help
-- settle  KEYS[1] the call's record, KEYS[1+i] the counter of hold i
--         ARGV: 'settle', now, call_id, actual cost ('' = the estimate), then five
--               values per hold: kind, estimate, period start, end, next end
--         returns {status, then per hold: charged}; status 0 settled, 1 already
--               settled, 2 unknown call
--
-- Redis Cluster runs a call slot by slot with further modes: see 'Cluster modes' below.

local mode = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end

local function int(n)  -- Lua 5.1 writes numbers as %.14g; money needs every digit
  return string.format('%d', n)
end

local byte, char, floor = string.byte, string.char, math.floor

local function enc(n, width)  -- big-endian, `width` bytes (4 or 6)
  local b6, b5, b4, b3 = n % 256, floor(n / 256) % 256, floor(n / 65536) % 256, floor(n / 16777216) % 256
  if width == 4 then return char(b3, b4, b5, b6) end
  return char(floor(n / 1099511627776) % 256, floor(n / 4294967296) % 256, b3, b4, b5, b6)
end

local function dec(s, from, width)
  if width == 4 then
    local a, b, c, d = byte(s, from, from + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
  end
  local a, b, c, d, e, f = byte(s, from, from + 5)
  return ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
end

-- Sliding window: a ring of the last `limit` admission times in one string.
-- Layout: capacity (4 bytes), head (4 bytes), then 6-byte big-endian ms timestamps.
-- While filling, entries are appended and head stays 0; once full, head is the
-- oldest entry and each admission overwrites it.
local HEADER, ENTRY = 8, 6

-- A ring's first WHOLE bytes are read in one command: all of a small ring, which is then
-- searched in Lua (a command per binary-search step cost Redis more than copying it), and
-- the header and oldest entries of a large one (a busy shared counter), whose other
-- entries are read with one GETRANGE each (copying it whole cost more still).
local WHOLE = 4096  -- bytes: rings up to ~680 entries are read whole

local function sw_reader(key)  -- returns read(at, width) and the ring's length
  local prefix = redis.call('GETRANGE', key, 0, WHOLE - 1)
  local len = #prefix
  if len == WHOLE then len = redis.call('STRLEN', key) end
  local function read(at, width)  -- `width` bytes from 0-based offset `at`
    if at + width <= #prefix then return string.sub(prefix, at + 1, at + width) end
    return redis.call('GETRANGE', key, at, at + width - 1)
  end
  return read, len
end

local function sw_entry(read, head, n, j)  -- j-th oldest entry, 0-based
  return dec(read(HEADER + ((head + j) % n) * ENTRY, ENTRY), 1, ENTRY)
end

local function sw_rebuild(key, read, head, n, keep, capacity, stamp)
  -- Rewrite the ring oldest-first with its newest `keep` entries, then `stamp`.
  local parts = {enc(capacity, 4), enc(0, 4)}
  for j = n - keep, n - 1 do
    parts[#parts + 1] = read(HEADER + ((head + j) % n) * ENTRY, ENTRY)
  end
  parts[#parts + 1] = stamp
  redis.call('SET', key, table.concat(parts))
end

local function sliding_window(key, op)
  local limit, window = op.limit, op.window
  local capacity, head, n = limit, 0, 0
  local read, len = sw_reader(key)
  if len >= HEADER then
    local header = read(0, HEADER)
    capacity, head, n = dec(header, 1, 4), dec(header, 5, 4), (len - HEADER) / ENTRY
  end
  local lo, hi, cutoff = 0, n, now - window  -- binary search: first entry in the window
  if n > 0 and sw_entry(read, head, n, 0) > cutoff then hi = 0 end  -- all in it: one probe
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if sw_entry(read, head, n, mid) > cutoff then hi = mid else lo = mid + 1 end
  end
  local in_window = n - lo
  local newest = n > 0 and sw_entry(read, head, n, n - 1) or 0
  local c = {admitted = in_window < limit, used = in_window}
  c.undo = math.max(now, newest)  -- the stamp a commit writes (cluster 'release' mode)
  if limit == 0 then
    c.retry = -1
  elseif not c.admitted then
    c.retry = math.max(1, sw_entry(read, head, n, n - limit) + window - now)
  else
    c.retry = 0
  end
  c.reset = in_window > 0 and newest + window - now or 0
  c.commit = function()
    if limit == 0 then return end
    local stamp = enc(math.max(now, newest), ENTRY)  -- keep the ring sorted if time steps back
    if capacity ~= limit and in_window < limit then
      -- The limit changed (policy reload). Only now, on an admission, is the ring resized:
      -- every entry still in the window is among the newest limit - 1, so none is lost.
      sw_rebuild(key, read, head, n, math.min(n, limit - 1), limit, stamp)
    elseif n + 1 == capacity then
      -- The last append rewrites the ring by SET: a string grown in place keeps Redis'
      -- spare room (up to as much again), and a full 10 000-entry ring took 115 kB for
      -- its 60 kB. Once, per ring: other appends stay O(1).
      local base = len >= HEADER and read(0, len) or (enc(capacity, 4) .. enc(0, 4))
      redis.call('SET', key, base .. stamp)
    elseif n < capacity then
      redis.call('SETRANGE', key, HEADER + n * ENTRY, stamp)
      if n == 0 then redis.call('SETRANGE', key, 0, enc(capacity, 4) .. enc(0, 4)) end
    elseif capacity < limit then
      sw_rebuild(key, read, head, n, n, limit, stamp)
    else
      -- The oldest entry is overwritten; an approved call past the limit may overwrite one
      -- still in the window, so the cluster's 'release' needs it back (op.undoable).
      if op.undoable then c.undo2 = sw_entry(read, head, n, 0) end
      redis.call('SETRANGE', key, HEADER + head * ENTRY, stamp)
      redis.call('SETRANGE', key, 4, enc((head + 1) % capacity, 4))
    end
    redis.call('PEXPIRE', key, window)
    c.used = math.min(in_window + 1, math.max(limit, capacity))
    c.reset = window
  end
  return c
end

-- Token bucket as GCRA: the key holds the theoretical arrival time (TAT) in ms.
local function token_bucket(key, op)
  local limit, window, burst = op.limit, op.window, op.burst
  local c = {used = 0}
  if limit == 0 then
    c.admitted, c.retry, c.reset = false, -1, 0
    c.commit = function() end
    return c
  end
  local interval = window / limit
  local tat = math.max(tonumber(redis.call('GET', key)) or now, now)
  local new_tat = tat + interval
  local allow_at = new_tat - burst * interval
  c.admitted = now >= allow_at
  c.retry = c.admitted and 0 or math.max(1, math.ceil(allow_at - now))
  local function settle(t)
    local remaining = math.max(0, math.min(burst, math.floor((now + burst * interval - t) / interval)))
    c.used = burst - remaining
    c.reset = math.max(0, math.ceil(t - now))
  end
  settle(tat)
  c.commit = function()
    redis.call('SET', key, string.format('%.17g', new_tat), 'PX', math.max(1, math.ceil(new_tat - now)))
    settle(new_tat)
  end
  return c
end

-- Fixed window: clock-aligned windows; the key holds "window_start:count".
local function fixed_window(key, op)
  local limit, window = op.limit, op.window
  local start = now - (now % window)
  local count = 0
  local stored = redis.call('GET', key)
  if stored then
    local s, n = string.match(stored, '^(%d+):(%d+)$')
    if tonumber(s) == start then count = tonumber(n) end
  end
  local c = {admitted = count < limit, used = count, undo = start}
  c.retry = limit == 0 and -1 or (c.admitted and 0 or start + window - now)
  c.reset = count > 0 and start + window - now or 0
  c.commit = function()
    redis.call('SET', key, string.format('%d:%d', start, count + 1), 'PX', start + window - now)
    c.used = count + 1
    c.reset = start + window - now
  end
  return c
end

-- Budget: one hash per counter: p (period start), s (spent), r (reserved), n (earliest
-- reservation expiry) and h:<call_id> = "amount:expiry" per reservation not yet settled.
-- Reservations left unsettled past their expiry are charged at their estimate. A
-- reservation in flight when the period ends is carried into the new one. The hash is
-- written only when something changed, so refused calls and usage reads create nothing.
local function charge_expired(key, b, upto)
  if not b.n or b.n > upto then return end
  local fields = redis.call('HGETALL', key)
  local next_expiry = nil
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == 'h:' then
      local amount, expiry = string.match(fields[i + 1], '^(%d+):(%d+)$')
      amount, expiry = tonumber(amount), tonumber(expiry)
      if expiry <= upto then
        b.s, b.r, b.dirty = b.s + amount, b.r - amount, true
        redis.call('HDEL', key, fields[i])
      elseif not next_expiry or expiry < next_expiry then
        next_expiry = expiry
      end
    end
  end
  b.n = next_expiry
end

local function budget_load(key, p0, p1, p2)
  local h = redis.call('HMGET', key, 'p', 's', 'r', 'n')
  local b = {p = tonumber(h[1]), s = tonumber(h[2]) or 0, r = tonumber(h[3]) or 0, n = tonumber(h[4])}
  if p1 == 0 then  -- period unknown (a settle for a rule since removed): keep the counter's
    b.start, b.finish = b.p or now, now
  elseif now >= p1 then  -- the daemon's clock lags Redis's: the next period has begun
    b.start, b.finish = p1, p2
  else
    b.start, b.finish = p0, p1
  end
  if b.p ~= b.start then
    if b.p then  -- the period ended: charge what expired in it, then start afresh
      charge_expired(key, b, math.min(now, b.start - 1))
      b.dirty = true
    end
    b.p, b.s = b.start, 0
  end
  charge_expired(key, b, now)
  return b
end

local function budget_save(key, b, min_ttl)
  if not b.dirty then return end
  redis.call('HSET', key, 'p', int(b.p), 's', int(b.s), 'r', int(b.r))
  if b.n then redis.call('HSET', key, 'n', int(b.n)) else redis.call('HDEL', key, 'n') end
  -- Live through the period, every reservation, and the period in which the latest
  -- reservation expires, so its charge is still there to be read.
  local ttl = math.max(b.finish - now, min_ttl, (b.keep or now) - now, 1)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end

local function budget(key, op, call_id)
  local b = budget_load(key, op.p0, op.p1, op.p2)
  local held = b.s + b.r
  local c = {used = b.s, reserved = b.r, reset = b.finish - now}
  c.admitted = held < op.limit and held + op.cost <= op.limit
  if c.admitted then c.retry = 0 elseif op.cost > op.limit then c.retry = -1 else c.retry = b.finish - now end
  c.commit = function()
    if op.cost > 0 then
      local expiry = now + op.window
      redis.call('HSET', key, 'h:' .. call_id, int(op.cost) .. ':' .. int(expiry))
      if not b.n or expiry < b.n then b.n = expiry end
      b.r, b.dirty = b.r + op.cost, true
      if expiry >= b.finish then b.keep = expiry + (op.p2 - op.p1) end
    end
    c.reserved = b.r
  end
  c.save = function() budget_save(key, b, op.window) end
  return c
end

-- Concurrency: a sorted set of the calls holding a slot, scored by lease expiry.
local function concurrency(key, op, call_id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)  -- reclaim slots of vanished callers
  local count = redis.call('ZCARD', key)
  local c = {admitted = count < op.limit, used = count, reset = 0}
  c.retry = c.admitted and 0 or -1
  c.commit = function()
    redis.call('ZADD', key, now + op.window, call_id)
    redis.call('PEXPIRE', key, op.window)  -- this lease is the latest to expire
    c.used = count + 1
  end
  return c
end

local EVALUATE = {sw = sliding_window, tb = token_bucket, fw = fixed_window, bg = budget, cc = concurrency}

local function decide()
  local dry, call_id, fingerprint = ARGV[3] == '1', ARGV[4], ARGV[5]
  local record_ttl, keep = tonumber(ARGV[6]), ARGV[7] == '1'
  if not dry then
    local record = redis.call('HMGET', KEYS[1], 'f', 'r')
    if record[1] then  -- a repeated check: answer as the first time, consume nothing
      if record[1] ~= fingerprint then return {3} end
      local reply = {2}
      for number in string.gmatch(record[2], '-?%d+') do reply[#reply + 1] = tonumber(number) end
      return reply
    end
  end
  local checks, blocked = {}, false
  for i = 2, #KEYS do
    local a = 8 + (i - 2) * 10
    local op = {
      kind = ARGV[a], role = tonumber(ARGV[a + 1]), limit = tonumber(ARGV[a + 2]),
      window = tonumber(ARGV[a + 3]), burst = tonumber(ARGV[a + 4]), cost = tonumber(ARGV[a + 5]),
      p0 = tonumber(ARGV[a + 6]), p1 = tonumber(ARGV[a + 7]), p2 = tonumber(ARGV[a + 8]),
      hold = ARGV[a + 9],
    }
    local c = EVALUATE[op.kind](KEYS[i], op, call_id)
    c.op = op
    if op.role == 1 and not c.admitted then blocked = true end
    checks[#checks + 1] = c
  end
  local numbers, holds = {}, {}
  for _, c in ipairs(checks) do
    if not dry and not blocked and (c.admitted or c.op.role == 2) then
      c.commit()
      if c.op.hold ~= '' then holds[#holds + 1] = c.op.hold end
    end
    if c.save then c.save() end
    for _, v in ipairs({c.admitted and 1 or 0, c.used, c.retry, c.reset, c.reserved or 0}) do
      numbers[#numbers + 1] = v
    end
  end
  if not dry and not blocked and call_id ~= '' and (keep or #holds > 0) then
    local stored = {}
    for i, v in ipairs(numbers) do stored[i] = int(v) end
    redis.call('HSET', KEYS[1], 'f', fingerprint, 'r', table.concat(stored, ','),
      'h', table.concat(holds, '\n'), 's', 'open')
    redis.call('PEXPIRE', KEYS[1], record_ttl)
  end
  local reply = {blocked and 1 or 0}
  for _, v in ipairs(numbers) do reply[#reply + 1] = v end
  return reply
end

-- Settle one hold (its five values start at ARGV[a]); returns what it charged.
local function settle_hold(key, a, call_id, actual)
  local kind, estimate = ARGV[a], tonumber(ARGV[a + 1])
  if kind == 'cc' then
    redis.call('ZREM', key, call_id)
    return 0
  end
  if tonumber(ARGV[a + 3]) == 0 and redis.call('EXISTS', key) == 0 then return 0 end
  local cost = actual == '' and estimate or tonumber(actual)
  local b = budget_load(key, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]))
  local held = redis.call('HGET', key, 'h:' .. call_id)
  if held then  -- still reserved: swap the reservation for the actual cost
    b.r = b.r - tonumber(string.match(held, '^(%d+):'))
    redis.call('HDEL', key, 'h:' .. call_id)
    b.s = b.s + cost
  else  -- already charged at its estimate when it expired: correct by the difference
    b.s = math.max(0, b.s + cost - estimate)
  end
  b.dirty = true
  budget_save(key, b, 0)
  return cost
end

local function settle()
  local call_id, actual = ARGV[3], ARGV[4]
  local state = redis.call('HGET', KEYS[1], 's')
  if not state then return {2} end
  if state == 'settled' then return {1} end
  local reply = {0}
  for i = 2, #KEYS do
    reply[#reply + 1] = settle_hold(KEYS[i], 5 + (i - 2) * 5, call_id, actual)
  end
  redis.call('HSET', KEYS[1], 's', 'settled')
  return reply
end

-- Cluster modes (store/cluster.py, docs/cluster.md). On Redis Cluster a call's counters
-- may sit in several hash slots and its record in another, and one script can only
-- touch one slot; so the cluster store runs these steps, one script call per slot. They
-- have no Python twin (the embedded store never needs them); the cluster tests hold
-- them to the same conformance table as `decide`.
--
-- claim    KEYS[1] the record; ARGV: 'claim', now, call_id, fingerprint, nonce, pending TTL
--          returns {0} claimed (a pending marker now holds the call_id), {2, numbers}
--          replayed, {3} call_id conflict, {4} another check of it is in flight
-- record   KEYS[1] the record; ARGV: 'record', now, nonce (of this check), fingerprint,
--          numbers (comma-separated), holds, TTL, keep ('1' = keep without holds)
--          returns {0} written (or, with nothing to keep, the claim dropped), {2, numbers}
--          when another check of the call_id recorded it first, {4} if it is in flight
-- unclaim  KEYS[1] the record; ARGV: 'unclaim', now, nonce: drop our pending marker (or
--          the record we wrote), never another check's
-- group    KEYS the counters of one slot; ARGV: 'group', now, dry, call_id, then the ten
--          values per op of `decide`. Commits the slot's ops unless one of its enforcing
--          ops refuses. Returns {status, then per op: admitted, used, retry, reset,
--          reserved, committed (1/0), two undo tokens}
-- release  KEYS counters of one slot that 'group' committed; ARGV: 'release', now,
--          call_id, then twelve values per op (the ten of `decide`, its two undo tokens).
--          Takes back exactly what that commit took; returns per op the five numbers of
--          a fresh look at the counter (admitted, used, retry, reset, reserved)
-- settle_mark   KEYS[1] the record; ARGV: 'settle_mark', now. Returns {0} (it was open,
--          now settled), {1} already settled, {2} unknown (or still pending)
-- settle_holds  KEYS the holds of one slot; ARGV: 'settle_holds', now, call_id, actual,
--          then five values per hold (as `settle`); returns per hold: charged

local function claim()
  local call_id, fingerprint, nonce, ttl = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
  local record = redis.call('HMGET', KEYS[1], 'f', 'r', 's')
  if record[1] then
    if record[1] ~= fingerprint then return {3} end
    if record[3] == 'pending' then return {4} end
    local reply = {2}
    for number in string.gmatch(record[2], '-?%d+') do reply[#reply + 1] = tonumber(number) end
    return reply
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
  local ttl, keep = tonumber(ARGV[7]), ARGV[8] == '1'
  local found = redis.call('HMGET', KEYS[1], 'f', 'r', 's', 'p')
  if found[1] and found[4] ~= nonce then  -- our claim expired and another check took it
    if found[3] == 'pending' then return {4} end
    local reply = {2}
    for number in string.gmatch(found[2], '-?%d+') do reply[#reply + 1] = tonumber(number) end
    return reply
  end
  if not keep and holds == '' then
    if found[1] then redis.call('DEL', KEYS[1]) end
    return {0}
  end
  -- The nonce stays: a check interrupted after this write gives its call back and drops
  -- the record with 'unclaim', which deletes only a record bearing its nonce.
  redis.call('HSET', KEYS[1], 'f', fingerprint, 'r', numbers, 'h', holds, 's', 'open', 'p', nonce)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {0}
end

local function read_ops(first_arg, width)
  local ops = {}
  for i = 1, #KEYS do
    local a = first_arg + (i - 1) * width
    ops[i] = {
      key = KEYS[i], kind = ARGV[a], role = tonumber(ARGV[a + 1]), limit = tonumber(ARGV[a + 2]),
      window = tonumber(ARGV[a + 3]), burst = tonumber(ARGV[a + 4]), cost = tonumber(ARGV[a + 5]),
      p0 = tonumber(ARGV[a + 6]), p1 = tonumber(ARGV[a + 7]), p2 = tonumber(ARGV[a + 8]),
      hold = ARGV[a + 9], undo = tonumber(ARGV[a + 10]), undo2 = tonumber(ARGV[a + 11]),
    }
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
    local committed = not dry and not blocked and (c.admitted or c.op.role == 2)
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

local RELEASE = {sw = sw_release, tb = tb_release, fw = fw_release, bg = bg_release, cc = cc_release}

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
  local state = redis.call('HGET', KEYS[1], 's')
  if state == 'settled' then return {1} end
  if state ~= 'open' then return {2} end
  redis.call('HSET', KEYS[1], 's', 'settled')
  return {0}
end

local function settle_holds()
  local call_id, actual = ARGV[3], ARGV[4]
  local reply = {}
  for i = 1, #KEYS do reply[i] = settle_hold(KEYS[i], 5 + (i - 1) * 5, call_id, actual) end
  return reply
end

local MODES = {
  decide = decide, settle = settle, claim = claim, unclaim = unclaim, record = record,
  group = group, release = release, settle_mark = settle_mark, settle_holds = settle_holds,
}
return MODES[mode]()
