-- grant.lua is prepended to acquire.lua and release.lua (see scripts.go): the FIFO hand-off
-- both need. It defines no entry point of its own.

-- Tokens are reserved in blocks: a fresh hold takes the next 16, so the process holding it can
-- give rising tokens to its own goroutines without a round trip.
local BLOCK = 16

-- now_ms is the server's clock, the only one every client's liveness deadline is measured on.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- grant_next hands the free lock (lock key absent) to the first live waiter, popping dead
-- ones on the way. The grant is the waiter's with a short TTL (grace) until it confirms by
-- running acquire, and is announced as "g <owner>" on the channel. If the first live waiter
-- is me, it is popped but not granted: the caller takes the lock itself.
-- Returns the chosen owner, or nil when nobody live waits.
local function grant_next(k_lock, k_fence, k_log, k_queue, k_live, me, now, grace, log_ttl, channel, publish)
  while true do
    local head = redis.call('LINDEX', k_queue, 0)
    if not head then return nil end
    local alive = tonumber(redis.call('HGET', k_live, head) or '0') >= now
    redis.call('LPOP', k_queue)
    redis.call('HDEL', k_live, head)
    if alive then
      if head ~= me then
        local v = redis.call('INCRBY', k_fence, BLOCK)
        redis.call('HSET', k_lock, head, 1)
        redis.call('PEXPIRE', k_lock, grace)
        redis.call('HSET', k_log, 'g:' .. head, v - BLOCK + 1)
        redis.call('PEXPIRE', k_log, log_ttl)
        redis.call(publish, channel, 'g ' .. head)
      end
      return head
    end
  end
end
