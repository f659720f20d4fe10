-- Twin: token_window.py (same name, same shape).

-- Token window: a token rate's clock-aligned windows of model tokens; the key holds
-- "window_start:count", as a fixed window's. A check takes nothing: it admits while the
-- window holds fewer tokens than the limit. The call's settle adds its actual tokens.
local TOKEN_CEILING = 1000000000000000  -- 10^15: a count stays exact in a double

local function tokens_in(key, start)  -- the tokens counted in the window from `start`
  local stored = redis.call('GET', key)
  if stored then
    local s, n = string.match(stored, '^(%d+):(%d+)$')
    if tonumber(s) == start then return tonumber(n) end
  end
  return 0
end

local function token_window(key, op)
  local limit, window = op.limit, op.window
  local start = now - (now % window)
  local count = tokens_in(key, start)
  local c = {admitted = count < limit, used = count}
  c.retry = limit == 0 and -1 or (c.admitted and 0 or start + window - now)
  c.reset = count > 0 and start + window - now or 0
  c.commit = function() end  -- nothing taken: the settle adds the call's tokens
  return c
end

-- The settle: add `tokens` to the current window (`window` 0: the rule is gone).
local function token_window_add(key, window, tokens)
  if window <= 0 or tokens <= 0 then return end
  local start = now - (now % window)
  local count = math.min(TOKEN_CEILING, tokens_in(key, start) + tokens)
  redis.call('SET', key, string.format('%d:%d', start, count), 'PX', start + window - now)
end
