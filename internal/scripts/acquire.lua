-- acquire: take or re-enter a reentrant, fenced lock in one round trip.
--
-- KEYS[1] lock hash   {owner: holdCount}, PEXPIRE'd to the lease TTL
-- KEYS[2] fence       integer counter, INCR'd on every fresh acquisition; never expires
-- KEYS[3] op log      hash {"a:"..owner / "r:"..owner: holdID}, so a retried call is recognised
-- ARGV[1] owner id
-- ARGV[2] lease TTL in milliseconds (> 0)
-- ARGV[3] hold id: unique per Lock/TryLock call, resent unchanged when the call is retried
-- ARGV[4] op log TTL in milliseconds
--
-- Returns {1, token, holdCount} when the caller holds the lock after the call (fresh, re-entered,
-- or a retry of a call that already succeeded), {0, pttl} when another owner holds it
-- (pttl = the holder's remaining TTL in ms, -1 if the key has no TTL).
-- The failure path only reads, so waiters that poll do not invalidate the holder's tracked key.
local count = redis.call('HGET', KEYS[1], ARGV[1])
if count then
  local token = tonumber(redis.call('GET', KEYS[2]) or '0')
  -- A retry of a call that already succeeded (its reply was lost) must not count twice.
  if redis.call('HGET', KEYS[3], 'a:' .. ARGV[1]) == ARGV[3] then
    return {1, token, tonumber(count)}
  end
  count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[3], 'a:' .. ARGV[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  return {1, token, count}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], ARGV[1], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[3], 'a:' .. ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {1, token, 1}
