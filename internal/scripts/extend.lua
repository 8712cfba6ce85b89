-- extend: reset the lock's TTL if, and only if, the owner still holds it.
--
-- KEYS[1] lock hash {owner: holdCount}
-- ARGV[1] owner id
-- ARGV[2] new TTL in milliseconds (> 0)
--
-- Returns 1 when the TTL was set, 0 when the owner does not hold the lock (nothing is changed).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
