-- extend: lengthen the lock's TTL if, and only if, the hold still exists.
--
-- KEYS[1] lock hash (see acquire.lua)
-- ARGV[1] hold id
-- ARGV[2] TTL in milliseconds (> 0)
--
-- Returns 1 when the hold exists (its TTL is now at least ARGV[2]; it never shrinks, since
-- other holds of the owner may rely on it), 0 when the hold is gone or the key is no longer a
-- lock hash (nothing is changed). A reader of a read-write lock whose own deadline has passed
-- (lib.lua) is gone too: it is pruned and gets 0.
local f = lock_fields(KEYS[1], '#' .. ARGV[1], '#m')
if not f or not f[1] then
  return 0
end
if f[2] == 'r' then
  local owner = f[1]
  if tonumber(redis.call('HGET', KEYS[1], '#e:' .. owner) or '0') < now_ms() then
    prune_readers(KEYS[1])
    return 0
  end
  add_reader(KEYS[1], owner, nil, ARGV[2])
  return 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
return 1
