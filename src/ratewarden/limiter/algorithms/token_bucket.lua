-- Twin: token_bucket.py (same name, same shape).

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
