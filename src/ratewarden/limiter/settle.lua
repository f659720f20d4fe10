-- settle.lua: replace a call's budget reservations by its actual cost, release its
-- slots, add its tokens to its token rates, compare its result with a loop rule's last
-- one, once. Twin: reference.py
-- `settle`. Layout: limiter/script.py, Mode.SETTLE.

-- Settle one hold (its five values start at ARGV[a]); returns what it charged. A model
-- call's settle (`model`) also adds what it moved on the counter to the day's model
-- record, `rw:spend:{<tag>}:<day>:m` beside the day's record (twin: record_spend); for a
-- reservation charged at its estimate when it expired in this period, what it moved and
-- that charge: the call's whole cost.
local function settle_hold(key, a, call_id, actual, model)
  local kind, estimate = ARGV[a], tonumber(ARGV[a + 1])
  if kind == 'cc' then
    redis.call('ZREM', key, call_id)
    return 0
  end
  if tonumber(ARGV[a + 3]) == 0 and redis.call('EXISTS', key) == 0 then return 0 end
  local cost = actual == '' and estimate or tonumber(actual)
  local b = budget_load(key, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]))
  local found = redis.call('HMGET', key, 'h:' .. call_id, 'x:' .. call_id)
  local before = b.charged or 0  -- what the load charged (expired reservations): not ours
  if found[1] then  -- still reserved: swap the reservation for the actual cost
    b.r = b.r - tonumber(string.match(found[1], '^(%d+):'))
    redis.call('HDEL', key, 'h:' .. call_id)
    charge(b, cost)
  elseif found[2] then  -- charged when it expired, in this period: correct by the difference
    redis.call('HDEL', key, 'x:' .. call_id)
    charge(b, cost - tonumber(found[2]))
    before = before - tonumber(found[2])  -- the model record takes the call's whole cost
  else  -- charged in an earlier period (or nothing reserved): only an excess lands here
    charge(b, math.max(0, cost - estimate))
  end
  b.dirty = true
  local moved = (b.charged or 0) - before
  budget_save(key, b, 0)
  if model and moved ~= 0 and SPEND_RETENTION_DAYS > 0 then
    local day = math.floor(now / 86400000)
    local record = 'rw:spend:' .. string.sub(key, 4, -4) .. ':' .. int(day) .. ':m'
    local total = (tonumber(redis.call('GET', record)) or 0) + moved
    redis.call('SET', record, int(total), 'PX', (day + 1 + SPEND_RETENTION_DAYS) * 86400000 - now)
  end
  return cost
end

-- A loop hold (values from ARGV[a]: kind, 0, limit, window, burst): a result other than
-- the one kept restarts the count, this call its first unit; the result is then kept.
local function settle_loop(key, kept_key, a, call_id, digest)
  local window = tonumber(ARGV[a + 3])
  if digest == '' or window == 0 then return 0 end  -- no result, or the rule is gone
  local kept = redis.call('GET', kept_key)
  if kept and kept ~= digest then
    redis.call('DEL', key)
    local op = {key = key, kind = ARGV[a], role = 1, limit = tonumber(ARGV[a + 2]),
                window = window, burst = tonumber(ARGV[a + 4])}
    EVALUATE[op.kind](key, op, call_id).commit()
  end
  redis.call('SET', kept_key, digest, 'PX', window)
  return 0
end

-- Settle the holds whose values start at ARGV[a] and keys at KEYS[k] (a loop hold has
-- two: its counter, then its kept result); per hold, what it charged.
local function settle_all(k, a, call_id, actual, digest, model)
  local reply = {}
  while a <= #ARGV do
    local kind = ARGV[a]
    if kind == 'bg' or kind == 'cc' then
      reply[#reply + 1] = settle_hold(KEYS[k], a, call_id, actual, model)
      k = k + 1
    elseif kind == 'tk' then  -- a token rate (estimate: the tokens; limit, window, 0)
      token_window_add(KEYS[k], tonumber(ARGV[a + 3]), tonumber(ARGV[a + 1]))
      reply[#reply + 1] = 0
      k = k + 1
    else
      reply[#reply + 1] = settle_loop(KEYS[k], KEYS[k + 1], a, call_id, digest)
      k = k + 2
    end
    a = a + 5
  end
  return reply
end

-- With a fingerprint (ARGV[7]), a record of another one is as unknown: the caller was
-- allowed to settle the call it read, and only that call is settled.
local function settle()
  local call_id, actual, digest, expected = ARGV[3], ARGV[4], ARGV[5], ARGV[7]
  local record = redis.call('HMGET', KEYS[1], 's', 'f')
  local state = record[1]
  if not state or (expected ~= '' and record[2] ~= expected) then return {2} end
  if state == 'settled' then return {1} end
  local reply = {0}
  for _, charged in ipairs(settle_all(2, 8, call_id, actual, digest, ARGV[6] == '1')) do
    reply[#reply + 1] = charged
  end
  redis.call('HSET', KEYS[1], 's', 'settled')
  return reply
end

-- The budget sweep (service/sweep.py): a counter whose earliest reservation expiry (n)
-- is due is loaded and saved, as a check of its scope would, so what expired unsettled
-- is charged at its estimate (and into the day's spend record) even when no call of the
-- scope comes again. ARGV[3..5]: the period of its rule in force (zeros: gone). Returns
-- {what it charged}; a counter with nothing due is not written.
local function sweep()
  local key = KEYS[1]
  local due = tonumber(redis.call('HGET', key, 'n'))
  if not due or due > now then return {0} end
  local b = budget_load(key, tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
  local charged = b.charged or 0
  budget_save(key, b, 0)
  if not b.dirty then  -- nothing expired: n named a reservation since settled (a settle
    if b.n then redis.call('HSET', key, 'n', int(b.n)) else redis.call('HDEL', key, 'n') end
  end  -- leaves n as it was); set right, or every sweep would come back to this counter
  return {charged}
end
