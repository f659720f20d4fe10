-- settle.lua: replace a call's budget reservations by its actual cost, release its
-- slots, once. Twin: reference.py `settle`. Layout: limiter/script.py, Mode.SETTLE.

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
  local found = redis.call('HMGET', key, 'h:' .. call_id, 'x:' .. call_id)
  if found[1] then  -- still reserved: swap the reservation for the actual cost
    b.r = b.r - tonumber(string.match(found[1], '^(%d+):'))
    redis.call('HDEL', key, 'h:' .. call_id)
    b.s = spend(b.s, cost)
  elseif found[2] then  -- charged when it expired, in this period: correct by the difference
    redis.call('HDEL', key, 'x:' .. call_id)
    b.s = spend(b.s, cost - tonumber(found[2]))
  else  -- charged in an earlier period (or nothing reserved): only an excess lands here
    b.s = spend(b.s, math.max(0, cost - estimate))
  end
  b.dirty = true
  budget_save(key, b, 0)
  return cost
end

-- With a fingerprint (ARGV[5]), a record of another one is as unknown: the caller was
-- allowed to settle the call it read, and only that call is settled.
local function settle()
  local call_id, actual, expected = ARGV[3], ARGV[4], ARGV[5]
  local record = redis.call('HMGET', KEYS[1], 's', 'f')
  local state = record[1]
  if not state or (expected ~= '' and record[2] ~= expected) then return {2} end
  if state == 'settled' then return {1} end
  local reply = {0}
  for i = 2, #KEYS do
    reply[#reply + 1] = settle_hold(KEYS[i], 6 + (i - 2) * 5, call_id, actual)
  end
  redis.call('HSET', KEYS[1], 's', 'settled')
  return reply
end
