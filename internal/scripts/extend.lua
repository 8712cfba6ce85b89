-- extend: lengthen the lock's TTL if, and only if, the hold still exists.
--
-- KEYS[1] lock hash (see acquire.lua)
-- ARGV[1] hold id
-- ARGV[2] TTL in milliseconds (> 0)
--
-- Returns 1 when the hold exists (its TTL is now at least ARGV[2]; it never shrinks, since
-- other holds of the owner may rely on it), 0 when the hold is gone or the key is no longer a
-- lock hash (nothing is changed).
local f = lock_fields(KEYS[1], '#' .. ARGV[1])
if f and f[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  return 1
end
return 0
