-- Twin: sliding_window.py (same name, same shape). See limiter/script.py for the layout.

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
