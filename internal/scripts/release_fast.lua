-- release's fast path (see release.lua for KEYS, ARGV and the reply): the owner's only hold of
-- a mutex or of a read-write lock taken to write, with nobody waiting, is let go by deleting
-- the lock, before the rest of the script defines anything. Whatever else the call meets (a
-- queue, other holds, readers, a waiter leaving, a clean-up) falls through to it.
local function release_fast()
  local mode = ARGV[10] or ''
  if ARGV[8] == '1' or ARGV[5] == '1' or (mode ~= '' and mode ~= 'w') or redis.call('EXISTS', KEYS[4]) == 1 then
    return nil
  end
  -- pcall: a lock key overwritten with another type is for the rest of the script to report.
  local f = redis.pcall('HMGET', KEYS[1], '#' .. ARGV[2], ARGV[1], '#v', '#k', '#m')
  if f.err or f[1] ~= '1' or f[2] ~= '1' or f[3] ~= LAYOUT or (f[4] or '') ~= (mode == 'w' and 'rw' or '') or f[5] == 'r' then
    return nil
  end
  log_release(KEYS[2], ARGV[1], ARGV[2], ARGV[3])
  redis.call('DEL', KEYS[1])
  return 2
end

local released = release_fast()
if released then
  return released
end
