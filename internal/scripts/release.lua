-- release: drop one hold of a reentrant lock; at zero hand the lock to the first live waiter
-- (direct grant: no herd, first come first served) or delete it.
--
-- KEYS[1] lock hash   {owner: holdCount}
-- KEYS[2] op log      hash (see acquire.lua)
-- KEYS[3] fence
-- KEYS[4] queue       list of waiting owners
-- KEYS[5] liveness    hash {waiting owner: deadline in ms of server time}
-- ARGV[1] owner id
-- ARGV[2] hold id of the hold being released (the id its acquire used)
-- ARGV[3] op log TTL in ms
-- ARGV[4] notification channel
-- ARGV[5] "1" to release only if the acquire with hold id ARGV[2] was applied: the clean-up
--         after an acquire whose reply was lost, which must not drop an older hold instead
-- ARGV[6] grace in ms: TTL of a lock granted to a waiter until it confirms
-- ARGV[7] PUBLISH or SPUBLISH
-- ARGV[8] "1" to also leave the queue (a waiter giving up; it may have been granted the lock)
--
-- Returns 3 when the lock was handed to a waiter ("g <owner>" published), 2 when it was
-- freed ("r" published), 1 when one of several holds was dropped (or an earlier attempt of
-- this release was already applied), 0 when the owner does not hold the lock.
local owner = ARGV[1]

if ARGV[8] == '1' then
  redis.call('LREM', KEYS[4], 0, owner)
  redis.call('HDEL', KEYS[5], owner)
  -- Only a lock granted to us and not yet confirmed is ours to give back here; if its grace
  -- ran out the key may be someone else's by now.
  local granted = redis.call('HGET', KEYS[2], 'g:' .. owner)
  redis.call('HDEL', KEYS[2], 'g:' .. owner)
  if not granted then
    return 0
  end
else
  if redis.call('HGET', KEYS[2], 'r:' .. owner) == ARGV[2] then
    return 1
  end
  if ARGV[5] == '1' and redis.call('HGET', KEYS[2], 'a:' .. owner) ~= ARGV[2] then
    return 0
  end
end
if not redis.call('HGET', KEYS[1], owner) then
  return 0
end
local n = redis.call('HINCRBY', KEYS[1], owner, -1)
redis.call('HSET', KEYS[2], 'r:' .. owner, ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if n > 0 then
  return 1
end
redis.call('DEL', KEYS[1])
if grant_next(KEYS[1], KEYS[3], KEYS[2], KEYS[4], KEYS[5], '', now_ms(),
    ARGV[6], ARGV[3], ARGV[4], ARGV[7]) then
  return 3
end
redis.call(ARGV[7], ARGV[4], 'r')
return 2
