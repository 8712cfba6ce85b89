-- lib.lua is prepended to the lock scripts (see scripts.go), after the "#!lua" line: the
-- layout, the token blocks and the FIFO hand-off they share. It defines no entry point of its
-- own. Scripts are kept to few Redis calls: every call inside a script costs server time on
-- each acquisition.
--
-- Why the "#!lua" line: with it Redis checks, before the script runs, that the server is the
-- master, has enough replicas (min-replicas-to-write) and memory; a script refused then has
-- changed nothing. Without it those errors could stop a script half-way. It also makes a
-- server older than 7.0 refuse every script at once (dlock needs 7.0 for PEXPIRE GT).
--
-- Errors that could still come mid-script are ruled out by the order of the writes, as long as
-- dlock's keys hold what dlock wrote (a lock key overwritten with another type is read with
-- pcall and counts as held by someone else): what a later step relies on is written first,
-- and PUBLISH, the one call a restricted ACL user may be refused, runs last through pcall, so
-- its refusal only costs a wake-up (waiters re-check on their own within their refresh period).

-- LAYOUT names this key layout. Every lock hash carries it in its "#v" field, and a script
-- that finds a lock without it (written by another dlock version) refuses to touch it, so
-- processes of two versions never both hold one lock during an upgrade.
local LAYOUT = '2'

-- Tokens are reserved in blocks: a fresh hold takes the next BLOCK, so the process holding it
-- can give rising tokens to its own goroutines without a round trip (cohortBlock in Go). The
-- hold's first token lives in the lock hash ("#t"), so a missing fence key never breaks it.
local BLOCK = 64

-- now_ms is the server's clock, the only one every client's liveness deadline is measured on.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- layout_error is the reply to a lock hash of another layout.
local function layout_error(k_lock)
  return redis.error_reply('DLOCKLAYOUT lock ' .. k_lock ..
    ' was written by another dlock version (key layout other than ' .. LAYOUT .. ')')
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

-- reserve_block reserves the next BLOCK fencing tokens and returns the first of them.
--
-- Tokens are never below the server's clock in microseconds, and the fence key expires once
-- that clock has passed every token it handed out. So a lock that is free leaves no key behind,
-- and a block reserved after the key expired (or after a restart that lost it) still starts
-- above every earlier token, as long as the server's clock does not step back. PXAT is
-- checked against the server's clock in ms: the key is gone only when now_ms > floor(v/1000)
-- + 1, that is once the clock in microseconds is above v.
local function reserve_block(k_fence)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local v = tonumber(redis.call('GET', k_fence) or '0') or 0
  if v < now then
    v = now
  end
  local first = v + 1
  v = v + BLOCK
  redis.call('SET', k_fence, string.format('%d', v), 'PXAT', string.format('%d', math.floor(v / 1000) + 1))
  return first
end

-- hold_lock writes a fresh hold of owner (count 1) with its token and sets the TTL. mark is
-- the hold's "#"..holdId field, or nil for a lock granted to a waiter, which adds its own
-- mark when it confirms.
local function hold_lock(k_lock, owner, mark, token, ttl)
  if mark then
    redis.call('HSET', k_lock, owner, 1, mark, 1, '#t', string.format('%d', token), '#v', LAYOUT)
  else
    redis.call('HSET', k_lock, owner, 1, '#t', string.format('%d', token), '#v', LAYOUT)
  end
  redis.call('PEXPIRE', k_lock, ttl)
end

-- grant gives the free lock to waiter head with the short TTL grace until it confirms by
-- running acquire. The op log records the grant (g:<head> = token) before the lock is
-- written, so the grantee can tell its grant from a stale one. The caller publishes
-- "g <head>" last (notify). It returns the token.
local function grant(k_lock, k_fence, k_log, head, grace, log_ttl)
  local token = reserve_block(k_fence)
  redis.call('HSET', k_log, 'g:' .. head, string.format('%d', token))
  redis.call('PEXPIRE', k_log, log_ttl)
  hold_lock(k_lock, head, nil, token, grace)
  return token
end

-- notify publishes msg on channel, last in a script: a user that may not publish loses the
-- wake-up, never a write.
local function notify(publish, channel, msg)
  redis.pcall(publish, channel, msg)
end

-- lock_fields reads fields of the lock hash; a key of another type (overwritten by hand) gives
-- nil and false, so callers treat it as a lock they do not hold.
local function lock_fields(k_lock, ...)
  local f = redis.pcall('HMGET', k_lock, ...)
  if f.err then
    return nil, false
  end
  return f, true
end
