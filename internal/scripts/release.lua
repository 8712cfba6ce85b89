-- release: drop one hold of a reentrant lock; at zero delete the lock and wake waiters.
--
-- KEYS[1] lock hash   {owner: holdCount}
-- KEYS[2] op log      hash {"a:"..owner / "r:"..owner: holdID}
-- ARGV[1] owner id
-- ARGV[2] hold id of the hold being released (the id its acquire used)
-- ARGV[3] op log TTL in milliseconds
-- ARGV[4] release notification channel
-- ARGV[5] "1" to release only if the acquire with hold id ARGV[2] was applied: the clean-up
--         after an acquire whose reply was lost, which must not drop an older hold instead
--
-- Returns 2 when the lock was freed (and a message published on ARGV[4]), 1 when one of several
-- holds was dropped and the lock stays held, 0 when the owner does not hold the lock (expired,
-- deleted or taken). A retry of a release that already succeeded returns 1: its effect stands and
-- is not applied twice.
if redis.call('HGET', KEYS[2], 'r:' .. ARGV[1]) == ARGV[2] then
  return 1
end
if ARGV[5] == '1' and redis.call('HGET', KEYS[2], 'a:' .. ARGV[1]) ~= ARGV[2] then
  return 0
end
if not redis.call('HGET', KEYS[1], ARGV[1]) then
  return 0
end
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
redis.call('HSET', KEYS[2], 'r:' .. ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if n > 0 then
  return 1
end
-- Only one owner can hold the lock at a time, so the hash has no other field to keep.
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[4], 'released')
return 2
