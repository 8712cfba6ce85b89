-- grant.lua is prepended to acquire.lua and release.lua (see scripts.go): the FIFO hand-off
-- both need. It defines no entry point of its own. Scripts are kept to few Redis calls: every
-- call inside a script costs server time on each acquisition.

-- Tokens are reserved in blocks: a fresh hold takes the next BLOCK, so the process holding it
-- can give rising tokens to its own goroutines without a round trip (cohortBlock in Go).
local BLOCK = 64

-- now_ms is the server's clock, the only one every client's liveness deadline is measured on.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- first_waiter returns the first live waiter of the queue (a sorted set scored by the time,
-- in ms, each waiter joined) and how long it has waited, dropping dead waiters on the way;
-- nil when nobody live waits.
local function first_waiter(k_queue, k_live)
  local now
  while true do
    local e = redis.call('ZRANGE', k_queue, 0, 0, 'WITHSCORES')
    if #e == 0 then return nil end
    now = now or now_ms()
    if tonumber(redis.call('HGET', k_live, e[1]) or '0') >= now then
      return e[1], now - tonumber(e[2])
    end
    redis.call('ZREM', k_queue, e[1])
    redis.call('HDEL', k_live, e[1])
  end
end

-- leave_queue takes a waiter out of the queue.
local function leave_queue(k_queue, k_live, who)
  redis.call('ZREM', k_queue, who)
  redis.call('HDEL', k_live, who)
end

-- reserve_block reserves the next BLOCK fencing tokens and returns the last of them. Tokens are
-- kept at least the server's clock in microseconds: a Redis restarted without persistence
-- forgets the fence key, and the next block then starts from the clock instead of from 1, so
-- tokens keep increasing across the restart (as long as the server's clock does not step back).
local function reserve_block(k_fence)
  local v = redis.call('INCRBY', k_fence, BLOCK)
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if v < floor then
    v = floor + BLOCK
    redis.call('SET', k_fence, string.format('%d', v))
  end
  return v
end

-- grant gives the free lock to waiter head with the short TTL grace until it confirms by
-- running acquire, and announces it as "g <head>" so that waiter alone wakes. It returns the
-- token reserved for head, for the caller to record as g:<head> in the op log.
local function grant(k_lock, k_fence, head, grace, channel, publish)
  local v = reserve_block(k_fence)
  redis.call('HSET', k_lock, head, 1)
  redis.call('PEXPIRE', k_lock, grace)
  redis.call(publish, channel, 'g ' .. head)
  return v - BLOCK + 1
end
