-- Twin: budget.py (same name, same shape).

-- Budget: one hash per counter: p (period start), s (spent), r (reserved), n (earliest
-- reservation expiry), h:<call_id> = "amount:expiry" per reservation not yet settled (one
-- per call: a call checked again replaces its own, so r is always the sum of the h:), and
-- x:<call_id> = amount per reservation charged at its estimate in this period because it
-- expired unsettled (so its late settle can correct this period, and no other).
-- Reservations left unsettled past their expiry are charged at their estimate. A
-- reservation in flight when the period ends is carried into the new one. The hash is
-- written only when something changed, so refused calls and usage reads create nothing.
--
-- Every change to spent (a settle, an expired reservation charged at its estimate, a late
-- settle's correction, which may be negative) is counted in b.charged and added, by
-- budget_save, to the counter's spend record of the day (UTC, by the script's clock):
-- `rw:spend:{<the counter's tag>}:<days since the epoch>`, a string of micro-units that
-- lives SPEND_RETENTION_DAYS past its day (store/keys.py). One GET and one SET per
-- counter charged; nothing when nothing was charged (a reservation, a refusal, a read).
--
-- Money never wraps: spent saturates at CEILING and then stays there until the period
-- ends (so it still denies: no budget exceeds CEILING), and a reservation takes at most
-- what is left below CEILING. Every figure stays below 3 x CEILING, far inside the
-- integers a double holds exactly (2^53).
local CEILING = 1000000000000000  -- micro-units; reference.MONEY_CEILING
-- A counter outlives its latest reservation's expiry by this much (ms), so the budget
-- sweep (service/sweep.py, every RATEWARDEN_SWEEP_INTERVAL_S, at most 300 s) sees it
-- due at three ticks at least; budget.SWEEP_GRACE_MS.
local SWEEP_GRACE_MS = 900000

-- Spent plus delta (may be negative), saturating; what it really moved is kept for the
-- day's record. (The twin's `spend` and `charge` in one: every function the script defines
-- is made again at each call, a decision's too, so none is added for spend records.)
local function charge(b, delta)
  local spent = CEILING
  if b.s < CEILING then spent = math.min(math.max(0, b.s + delta), CEILING) end
  b.charged, b.s = (b.charged or 0) + spent - b.s, spent
end

local function charge_expired(key, b, upto, mark)
  if not b.n or b.n > upto then return end
  local fields = redis.call('HGETALL', key)
  local next_expiry = nil
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == 'h:' then
      local amount, expiry = string.match(fields[i + 1], '^(%d+):(%d+)$')
      amount, expiry = tonumber(amount), tonumber(expiry)
      if expiry <= upto then
        charge(b, amount)
        b.r, b.dirty = b.r - amount, true
        redis.call('HDEL', key, fields[i])
        if mark then redis.call('HSET', key, 'x:' .. string.sub(fields[i], 3), int(amount)) end
      elseif not next_expiry or expiry < next_expiry then
        next_expiry = expiry
      end
    end
  end
  b.n = next_expiry
end

local function forget_charges(key)  -- a new period: no correction may reach back past it
  local fields = redis.call('HKEYS', key)
  for i = 1, #fields do
    if string.sub(fields[i], 1, 2) == 'x:' then redis.call('HDEL', key, fields[i]) end
  end
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
      charge_expired(key, b, math.min(now, b.start - 1), false)
      forget_charges(key)
      b.dirty = true
    end
    b.p, b.s = b.start, 0
  end
  charge_expired(key, b, now, true)
  return b
end

local function budget_save(key, b, min_ttl)
  if not b.dirty then return end
  if (b.charged or 0) ~= 0 and SPEND_RETENTION_DAYS > 0 then  -- the day's record (twin:
    local day = math.floor(now / 86400000)                  -- record_spend), plus charged
    local record = 'rw:spend:' .. string.sub(key, 4, -4) .. ':' .. int(day)  -- rw:{tag}:bg
    local total = (tonumber(redis.call('GET', record)) or 0) + b.charged
    redis.call('SET', record, int(total), 'PX', (day + 1 + SPEND_RETENTION_DAYS) * 86400000 - now)
  end
  b.charged = 0  -- recorded: a second save of the same load adds nothing
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
    if b.r > 0 then  -- one reservation per call: checked again, it replaces its last one
      local held = redis.call('HGET', key, 'h:' .. call_id)
      if held then
        local amount, expiry = string.match(held, '^(%d+):(%d+)$')
        b.r, b.dirty = b.r - tonumber(amount), true
        redis.call('HDEL', key, 'h:' .. call_id)
        c.undo, c.undo2 = tonumber(amount), tonumber(expiry)  -- what 'release' puts back
      end
    end
    if op.cost > 0 then
      local expiry, amount = now + op.window, math.min(op.cost, CEILING - b.r)
      redis.call('HSET', key, 'h:' .. call_id, int(amount) .. ':' .. int(expiry))
      if not b.n or expiry < b.n then b.n = expiry end
      b.r, b.dirty = b.r + amount, true
      local keep = expiry + SWEEP_GRACE_MS  -- the sweep must still find it due
      if expiry >= b.finish then keep = math.max(keep, expiry + (op.p2 - op.p1)) end
      b.keep = math.max(b.keep or 0, keep)
    end
    c.reserved = b.r
  end
  c.save = function() budget_save(key, b, op.window) end
  return c
end
