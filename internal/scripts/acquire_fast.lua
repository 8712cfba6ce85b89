-- acquire's fast path (see acquire.lua for KEYS, ARGV and the reply): a free lock that nobody
-- waits for, taken by a call the op log knows nothing of (no give-up of its hold id, no release
-- of it, no queue place of its owner). That is the common case, one lock per order or per user,
-- and it is served before the rest of the script defines anything. Whatever else the call meets
-- (a held lock, a queue, a semaphore, holds of lost replies to drop) falls through to it.
local function acquire_fast()
  local mode = ARGV[13] or ''
  if mode == 's' or (ARGV[15] or '') ~= '' or redis.call('EXISTS', KEYS[1], KEYS[4]) > 0 then
    return nil
  end
  local owner, id = ARGV[1], ARGV[3]
  local me = owner -- the owner's queue member (lib.lua member)
  if mode ~= '' then
    me = mode .. ':' .. owner
  end
  local log = redis.call('HMGET', KEYS[3], 'u:' .. id, 'r:' .. owner, 'p:' .. me)
  if log[1] or log[3] or (log[2] and (' ' .. log[2] .. ' '):find(' ' .. id .. ' ', 1, true)) then
    return nil
  end
  local token = reserve_block(KEYS[2], ARGV[4])
  hold_lock(KEYS[1], owner, '#' .. id, token, ARGV[2], mode, nil)
  return {1, token, 1, 0}
end

local taken = acquire_fast()
if taken then
  return taken
end
