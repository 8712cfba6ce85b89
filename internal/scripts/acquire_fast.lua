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
  local token = reserve_block(KEYS[2])
  local hset = {'HSET', KEYS[1], owner, 1, '#t', string.format('%d', token), '#v', LAYOUT, '#' .. id, 1}
  if mode ~= '' then
    for _, v in ipairs({'#k', 'rw', '#m', mode}) do
      hset[#hset + 1] = v
    end
  end
  if mode == 'r' then
    -- A reader's mark names it, and its deadline bounds the read phase's (lib.lua hold_lock).
    local d = now_ms() + tonumber(ARGV[2])
    hset[10] = owner
    for _, v in ipairs({'#e:' .. owner, d, '#r', 1, '#x', d}) do
      hset[#hset + 1] = v
    end
  end
  redis.call(unpack(hset))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token, 1, 0}
end

local taken = acquire_fast()
if taken then
  return taken
end
