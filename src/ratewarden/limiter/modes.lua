-- modes.lua: the entry point: run the mode ARGV[1] names (limiter/script.py, Mode).

local MODES = {
  decide = decide, settle = settle, claim = claim, unclaim = unclaim, record = record,
  group = group, release = release, settle_mark = settle_mark, settle_holds = settle_holds,
  sweep = sweep,
}
return MODES[mode]()
