-- codec.lua: what every mode shares: the mode and the clock, and how numbers are written.
-- The script is assembled from this file, the algorithms and the modes (limiter/script.py,
-- which also documents every mode's KEYS, ARGV and reply). Times are ms since the epoch,
-- money is integer micro-units.

local mode = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end

local function int(n)  -- Lua 5.1 writes numbers as %.14g; money needs every digit
  return string.format('%d', n)
end

local byte, char, floor = string.byte, string.char, math.floor

local function enc(n, width)  -- big-endian, `width` bytes (4 or 6)
  local b6, b5, b4, b3 = n % 256, floor(n / 256) % 256, floor(n / 65536) % 256, floor(n / 16777216) % 256
  if width == 4 then return char(b3, b4, b5, b6) end
  return char(floor(n / 1099511627776) % 256, floor(n / 4294967296) % 256, b3, b4, b5, b6)
end

local function dec(s, from, width)
  if width == 4 then
    local a, b, c, d = byte(s, from, from + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
  end
  local a, b, c, d, e, f = byte(s, from, from + 5)
  return ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
end
