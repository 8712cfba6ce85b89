-- latch_set: start a count-down latch at a count, unless it is counting already.
--
-- KEYS[1] latch hash {"#k": "latch", "#v": layout, "#n": count, "#g": generation: the call id
--         that set this count} (the lock key of its name)
-- KEYS[2] op log      hash (the lock's, acquire.lua): ls:<call id> / ld:<call id> = 1 for a
--                     latch call applied, kept for the op log's TTL, past the latch itself
-- KEYS[3] queue, KEYS[4] liveness (the lock's, acquire.lua): a name free but waited for is in
--                     use as the kind its waiters wait for
-- ARGV[1] count (>= 1)
-- ARGV[2] TTL in ms: an abandoned latch (no CountDown for this long) disappears
-- ARGV[3] call id, unique per call and sent unchanged when the call is resent
-- ARGV[4] op log TTL in ms
--
-- Returns 1 when the latch was set (by this call: a resend, or the first send arriving late,
-- answers 1 again and changes nothing, even once the latch has opened or been set anew), 0
-- when it was counting already (nothing changed). A key of another kind (a lock, a
-- semaphore), or a free name that lock callers of another kind wait for, is refused with
-- DLOCKKIND, one of another layout with DLOCKLAYOUT, and left as it is.
if redis.call('HEXISTS', KEYS[2], 'ls:' .. ARGV[3]) == 1 then
  return 1
end
local f, refused = latch_fields(KEYS[1])
if not f then
  return refused
end
if f[1] then
  return 0
end
local head = first_waiter(KEYS[3], KEYS[4])
if head then
  -- Free for a moment (a hand-off, a holder that expired) while its waiters wait for another
  -- kind of lock: the name is in use as that kind, as acquire has it (take_free).
  return kind_error(KEYS[1], 'latch', member_kind(head))
end
redis.call('HSET', KEYS[2], 'ls:' .. ARGV[3], 1)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[1], '#k', 'latch', '#v', LAYOUT, '#n', ARGV[1], '#g', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
