-- force_release: break a lock whoever holds it (an operator's tool), handing it to the first
-- live waiter as a normal release would. The holder learns of it through its loss detection.
--
-- KEYS[1] lock hash, KEYS[2] op log, KEYS[3] fence, KEYS[4] queue, KEYS[5] liveness
-- ARGV[1] op log TTL in ms, ARGV[2] channel, ARGV[3] grace in ms, ARGV[4] PUBLISH or SPUBLISH
--
-- Returns 1 when a lock was broken, 0 when it was free.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('DEL', KEYS[1])
local head = first_waiter(KEYS[4], KEYS[5])
if head then
  leave_queue(KEYS[4], KEYS[5], head)
  local token = grant(KEYS[1], KEYS[3], head, ARGV[3], ARGV[2], ARGV[4])
  redis.call('HSET', KEYS[2], 'g:' .. head, token)
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return 1
