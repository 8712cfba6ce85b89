-- fence_floor: raise a lock's fencing counter to at least a token handed out on another server,
-- so every hold taken here afterwards gets a higher token. A Redlock lease's token is the
-- highest of its masters' tokens; it is raised on a quorum of them before the lease is handed
-- out, and any later quorum shares a master with that one.
--
-- KEYS[1] the lock's fence key (see reserve_block in head.lua)
-- ARGV[1] the floor: a token (decimal, below 2^53, as every token is)
-- ARGV[2] op log TTL in ms: how long the key outlives its value (see reserve_block)
--
-- Returns 1 when the counter was raised, 0 when it was already at or above the floor. Like
-- reserve_block, the key expires ARGV[2] ms after the server's clock in microseconds passes its
-- value: from then on the clock alone keeps tokens above it.
local floor = tonumber(ARGV[1])
local v = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if v >= floor then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', string.format('%d', math.floor(floor / 1000) + 1 + tonumber(ARGV[2])))
return 1
