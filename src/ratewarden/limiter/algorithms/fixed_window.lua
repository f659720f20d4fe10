-- Twin: fixed_window.py (same name, same shape).

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
