-- extend: lengthen the lock's TTL if, and only if, the hold still exists.
--
-- KEYS[1] lock hash {owner: holdCount, "#"..holdId: 1 per hold}
-- ARGV[1] hold id
-- ARGV[2] TTL in milliseconds (> 0)
--
-- Returns 1 when the hold exists (its TTL is now at least ARGV[2]; it never shrinks, since
-- other holds of the owner may rely on it), 0 when the hold is gone (nothing is changed).
if redis.call('HEXISTS', KEYS[1], '#' .. ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  return 1
end
return 0
