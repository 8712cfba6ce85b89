-- fenced_set: write a value to a fenced resource unless the writer's fencing token is stale.
--
-- KEYS[1] resource hash {v: value, t: highest token accepted}
-- ARGV[1] value
-- ARGV[2] writer's fencing token (decimal uint64)
--
-- Returns 1 when written; 0 when rejected because a higher token was already accepted.
-- Tokens are compared as decimal strings of equal-or-different length so that values above
-- 2^53 (where Lua numbers lose precision) still compare exactly.
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local cur = redis.call('HGET', KEYS[1], 't')
if cur and less(ARGV[2], cur) then
  return 0
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 't', ARGV[2])
return 1
