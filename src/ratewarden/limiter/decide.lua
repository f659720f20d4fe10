-- decide.lua: evaluate all counters of one call, then commit all or nothing, and record
-- an allowed call (its answer for replays, what it holds for its settle).
-- Twin: reference.py `decide`. Layout: limiter/script.py, Mode.DECIDE.

local EVALUATE = {sw = sliding_window, tb = token_bucket, fw = fixed_window, bg = budget, cc = concurrency,
  tk = token_window}

local function read_op(key, a)  -- the ten values of one op, from ARGV[a] on
  return {
    key = key, kind = ARGV[a], role = tonumber(ARGV[a + 1]), limit = tonumber(ARGV[a + 2]),
    window = tonumber(ARGV[a + 3]), burst = tonumber(ARGV[a + 4]), cost = tonumber(ARGV[a + 5]),
    p0 = tonumber(ARGV[a + 6]), p1 = tonumber(ARGV[a + 7]), p2 = tonumber(ARGV[a + 8]),
    hold = ARGV[a + 9],
  }
end

local function recorded_numbers(reply, text)  -- a record's answer, appended to reply
  for number in string.gmatch(text, '-?%d+') do reply[#reply + 1] = tonumber(number) end
  return reply
end

-- A repeated check: answered as the first time, consuming nothing; nil if new.
local function answer_from_record(fingerprint)
  local record = redis.call('HMGET', KEYS[1], 'f', 'r', 's')
  if not record[1] then return nil end
  if record[1] ~= fingerprint then return {3} end
  if record[3] == 'settled' then return {5} end  -- a finished call is not run again
  return recorded_numbers({2}, record[2])
end

-- Whether an op takes its unit once the call is allowed (and is listed in its record):
-- a token rate takes nothing, but is listed whatever its verdict (its settle adds).
local function consumes(c)
  return c.admitted or c.op.role == 2 or c.op.kind == 'tk'
end

-- Commit what the call consumes (if `commit`); the numbers of every op, and its holds.
local function apply(checks, commit)
  local numbers, holds = {}, {}
  for _, c in ipairs(checks) do
    if commit and consumes(c) then
      c.commit()
      if c.op.hold ~= '' then holds[#holds + 1] = c.op.hold end
    end
    if c.save then c.save() end
    for _, v in ipairs({c.admitted and 1 or 0, c.used, c.retry, c.reset, c.reserved or 0}) do
      numbers[#numbers + 1] = v
    end
  end
  return numbers, holds
end

local function decide()
  local dry, call_id, fingerprint = ARGV[3] == '1', ARGV[4], ARGV[5]
  local record_ttl, named = tonumber(ARGV[6]), ARGV[7] == '1'
  if named and not dry then  -- an id the daemon made up is new: no record to read
    local answered = answer_from_record(fingerprint)
    if answered then return answered end
  end
  local checks, blocked = {}, false
  for i = 2, #KEYS do
    local op = read_op(KEYS[i], 8 + (i - 2) * 10)
    local c = EVALUATE[op.kind](op.key, op, call_id)
    c.op = op
    if op.role == 1 and not c.admitted then blocked = true end
    checks[#checks + 1] = c
  end
  local commit = not dry and not blocked
  local numbers, holds = apply(checks, commit)
  if commit and call_id ~= '' and (named or #holds > 0) then
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

-- A decision, the hot mode, returns here: Redis runs the whole script body at every call,
-- and each function below it would be made again (a closure apiece) for nothing.
if mode == 'decide' then return decide() end
