-- decide.lua: decide one call against all its matching rules, atomically.
--
-- Phase 1 evaluates every counter without writing; phase 2 commits only if no
-- enforcing counter refused (all or nothing). The pure-Python twin of this script is
-- limiter/reference.py; the conformance tests hold the two to the same decisions.
--
-- KEYS[i]   counter key of op i (see store/keys.py)
-- ARGV[1]   now in ms since the epoch, or "" to read Redis TIME (tests inject a clock)
-- ARGV[2]   "1" for a dry run: evaluate and report, never consume (GET /v1/usage)
-- ARGV[3..] five values per op: algorithm ("sw" sliding window, "tb" token bucket,
--           "fw" fixed window), role (0 shadow, 1 enforce, 2 forced), limit,
--           window in ms, burst (token bucket capacity)
-- Returns   {blocked, then per op: admitted, used, retry_ms, reset_ms}, where `used` is
--           after this call was counted (or not) and retry_ms = -1 when waiting cannot
--           help (limit 0). Times are in ms.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local dry = ARGV[2] == '1'

local function enc(n, width)
  local bytes = {}
  for i = width, 1, -1 do
    bytes[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(bytes)
end

local function dec(s, from, width)
  local n = 0
  for i = from, from + width - 1 do
    n = n * 256 + string.byte(s, i)
  end
  return n
end

-- Sliding window: a ring of the last `limit` admission times in one string.
-- Layout: capacity (4 bytes), head (4 bytes), then 6-byte big-endian ms timestamps.
-- While filling, entries are appended and head stays 0; once full, head is the
-- oldest entry and each admission overwrites it.
local HEADER, ENTRY = 8, 6

local function sw_entry(key, head, n, j)  -- j-th oldest entry, 0-based
  local at = HEADER + ((head + j) % n) * ENTRY
  return dec(redis.call('GETRANGE', key, at, at + ENTRY - 1), 1, ENTRY)
end

local function sw_rebuild(key, head, n, keep, capacity, stamp)
  -- Rewrite the ring oldest-first with its newest `keep` entries, then `stamp`.
  local parts = {enc(capacity, 4), enc(0, 4)}
  for j = n - keep, n - 1 do
    parts[#parts + 1] = enc(sw_entry(key, head, n, j), ENTRY)
  end
  parts[#parts + 1] = stamp
  redis.call('SET', key, table.concat(parts))
end

local function sliding_window(key, limit, window)
  local capacity, head, n = limit, 0, 0
  local len = redis.call('STRLEN', key)
  if len >= HEADER then
    local header = redis.call('GETRANGE', key, 0, HEADER - 1)
    capacity, head, n = dec(header, 1, 4), dec(header, 5, 4), (len - HEADER) / ENTRY
  end
  local lo, hi, cutoff = 0, n, now - window  -- binary search: first entry in the window
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if sw_entry(key, head, n, mid) > cutoff then hi = mid else lo = mid + 1 end
  end
  local in_window = n - lo
  local newest = n > 0 and sw_entry(key, head, n, n - 1) or 0
  local c = {admitted = in_window < limit, used = in_window}
  if limit == 0 then
    c.retry = -1
  elseif not c.admitted then
    c.retry = math.max(1, sw_entry(key, head, n, n - limit) + window - now)
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
      sw_rebuild(key, head, n, math.min(n, limit - 1), limit, stamp)
    elseif n < capacity then
      redis.call('SETRANGE', key, HEADER + n * ENTRY, stamp)
      if n == 0 then redis.call('SETRANGE', key, 0, enc(capacity, 4) .. enc(0, 4)) end
    elseif capacity < limit then
      sw_rebuild(key, head, n, n, limit, stamp)
    else
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
local function token_bucket(key, limit, window, burst)
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
local function fixed_window(key, limit, window)
  local start = now - (now % window)
  local count = 0
  local stored = redis.call('GET', key)
  if stored then
    local s, n = string.match(stored, '^(%d+):(%d+)$')
    if tonumber(s) == start then count = tonumber(n) end
  end
  local c = {admitted = count < limit, used = count}
  c.retry = limit == 0 and -1 or (c.admitted and 0 or start + window - now)
  c.reset = count > 0 and start + window - now or 0
  c.commit = function()
    redis.call('SET', key, string.format('%d:%d', start, count + 1), 'PX', start + window - now)
    c.used = count + 1
    c.reset = start + window - now
  end
  return c
end

local checks = {}
local blocked = false
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 5
  local algorithm, role = ARGV[a], tonumber(ARGV[a + 1])
  local limit, window, burst = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local c
  if algorithm == 'sw' then
    c = sliding_window(KEYS[i], limit, window)
  elseif algorithm == 'tb' then
    c = token_bucket(KEYS[i], limit, window, burst)
  else
    c = fixed_window(KEYS[i], limit, window)
  end
  c.role = role
  if role == 1 and not c.admitted then blocked = true end
  checks[i] = c
end

local reply = {blocked and 1 or 0}
for i, c in ipairs(checks) do
  if not dry and not blocked and (c.admitted or c.role == 2) then
    c.commit()
  end
  reply[#reply + 1] = c.admitted and 1 or 0
  reply[#reply + 1] = c.used
  reply[#reply + 1] = c.retry
  reply[#reply + 1] = c.reset
end
return reply
