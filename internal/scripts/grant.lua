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

-- next_waiter pops the queue up to its first live waiter and returns it (nil when nobody
-- live waits). The lock key must be absent.
local function next_waiter(k_queue, k_live)
  if redis.call('LLEN', k_queue) == 0 then return nil end
  local now = now_ms()
  while true do
    local head = redis.call('LPOP', k_queue)
    if not head then return nil end
    local alive = tonumber(redis.call('HGET', k_live, head) or '0') >= now
    redis.call('HDEL', k_live, head)
    if alive then return head end
  end
end

-- grant gives the free lock to waiter head with the short TTL grace until it confirms by
-- running acquire, and announces it as "g <head>" so that waiter alone wakes. It returns the
-- token reserved for head, for the caller to record as g:<head> in the op log.
local function grant(k_lock, k_fence, head, grace, channel, publish)
  local v = redis.call('INCRBY', k_fence, BLOCK)
  redis.call('HSET', k_lock, head, 1)
  redis.call('PEXPIRE', k_lock, grace)
  redis.call(publish, channel, 'g ' .. head)
  return v - BLOCK + 1
end
