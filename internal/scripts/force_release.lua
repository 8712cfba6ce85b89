-- force_release: break a lock whoever holds it (an operator's tool), handing it to the first
-- live waiter as a normal release would. The holder learns of it through its loss detection.
-- A key of another layout or type is deleted too: the operator asked for it.
--
-- KEYS[1] lock hash, KEYS[2] op log, KEYS[3] fence, KEYS[4] queue, KEYS[5] liveness
-- ARGV[1] op log TTL in ms, ARGV[2] channel, ARGV[3] grace in ms, ARGV[4] PUBLISH or SPUBLISH
--
-- Returns 1 when a lock was broken, 0 when it was free.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local head = first_waiter(KEYS[4], KEYS[5])
local latch = lock_fields(KEYS[1], '#k', '#g')
redis.call('DEL', KEYS[1])
if latch and latch[1] == 'latch' then
  notify(ARGV[4], ARGV[2], latch[2] and ('z ' .. latch[2]) or 'z') -- a latch broken is open
  return 1
end
if head then
  leave_queue(KEYS[4], KEYS[5], head)
  local msgs = {}
  grant(KEYS[1], KEYS[3], KEYS[2], KEYS[4], KEYS[5], head, ARGV[3], ARGV[1], msgs)
  notify_all(ARGV[4], ARGV[2], msgs)
end
return 1
