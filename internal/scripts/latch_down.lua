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
local f, refused = latch_fields(KEYS[1], '#n', '#g')
if not f then
  return refused
end
local open = not f[1]
if redis.call('HSETNX', KEYS[2], 'ld:' .. ARGV[4], 1) == 0 then
  return open and -1 or tonumber(f[3]) -- this call was applied already (its reply was lost)
end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if open then
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
