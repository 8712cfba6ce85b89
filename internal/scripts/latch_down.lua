-- latch_down: count a latch down by one; at zero it is deleted and its waiters are told ("z
-- <generation>": a waiter trusts only the opening of a count it read, not a message of an
-- earlier one still on its way).
--
-- KEYS[1] latch hash (see latch_set.lua)
-- KEYS[2] op log (see latch_set.lua)
-- ARGV[1] TTL in ms, renewed: a latch counted down lives this long after
-- ARGV[2] notification channel
-- ARGV[3] PUBLISH or SPUBLISH
-- ARGV[4] call id, unique per call and sent unchanged when the call is resent: a resend, or
--         the first send arriving late, counts nothing (ld:<id> in the op log), even once the
--         latch has opened or been set anew
-- ARGV[5] op log TTL in ms
--
-- Returns the count after the call: -1 when there was no latch (never set, already at zero,
-- or expired: nothing changed, as counting below zero does nothing). A key of another kind is
-- refused as in latch_set.lua.
if redis.call('HEXISTS', KEYS[2], 'ld:' .. ARGV[4]) == 1 then
  -- This call was applied already (its reply was lost), before anything else is looked at:
  -- the latch may have opened since, and its name been taken as a lock.
  local f = latch_fields(KEYS[1], '#n', '#g')
  return f and f[1] and tonumber(f[3]) or -1
end
local f, refused = latch_fields(KEYS[1], '#n', '#g')
if not f then
  return refused
end
redis.call('HSET', KEYS[2], 'ld:' .. ARGV[4], 1)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if not f[1] then
  return -1
end
local n = redis.call('HINCRBY', KEYS[1], '#n', -1)
if n <= 0 then
  redis.call('DEL', KEYS[1])
  notify(ARGV[3], ARGV[2], f[4] and ('z ' .. f[4]) or 'z')
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
