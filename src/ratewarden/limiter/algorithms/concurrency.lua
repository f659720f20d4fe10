-- Twin: concurrency.py (same name, same shape).

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
