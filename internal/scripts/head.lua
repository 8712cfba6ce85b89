-- head.lua opens every lock script (see scripts.go), after the "#!lua" line: the layout, the
-- token blocks and a fresh hold's fields, which an operation's fast path needs. The fast path
-- runs before lib.lua's definitions exist: they are made only when the fast path does not
-- serve the call, because making them costs server time on every call. Scripts are kept to
-- few Redis calls: every call inside a script costs server time on each acquisition.
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

-- reserve_block reserves the next BLOCK fencing tokens and returns the first of them.
--
-- Tokens are never below the server's clock in microseconds, and the fence key expires keep_ms
-- (the op log's window) after that clock has passed every token it handed out. So a lock that
-- is free leaves no key behind once the op log's window has passed, and a block reserved after
-- the key expired (or after a restart that lost it) still starts above every earlier token, as
-- long as the server's clock does not step back. The key outlives its value so that a failover
-- to a replica whose clock is behind the old master's (by less than keep_ms) finds the counter
-- replicated and keeps tokens rising. PXAT is checked against the server's clock in ms: the
-- key is gone only when now_ms > floor(v/1000) + 1 + keep_ms.
local function reserve_block(k_fence, keep_ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local v = tonumber(redis.call('GET', k_fence) or '0') or 0
  if v < now then
    v = now
  end
  local first = v + 1
  v = v + BLOCK
  redis.call('SET', k_fence, string.format('%d', v), 'PXAT', string.format('%d', math.floor(v / 1000) + 1 + tonumber(keep_ms)))
  return first
end

-- hold_lock writes a fresh hold of owner (count 1) with its token and sets the TTL. mark is
-- the hold's "#"..holdId field, or nil for a lock granted to a waiter that confirms the grant
-- with its own acquire (see grant). mode is '' for a mutex, 'r' or 'w' for a read-write lock.
-- sem, for a semaphore (mode 'r'), is {permits, n}: its number of permits and how many the
-- owner takes.
local function hold_lock(k_lock, owner, mark, token, ttl, mode, sem)
  local count = 1
  if mode == 'r' and not mark then
    count = 0 -- granted, until the reader confirms
  end
  local args = {k_lock, owner, count, '#t', string.format('%d', token), '#v', LAYOUT}
  local function add(f, v)
    args[#args + 1] = f
    args[#args + 1] = v
  end
  if sem then
    add('#k', 'sem')
    add('#n', sem[1])
    add('#u', sem[2])
    add('#c:' .. owner, sem[2])
  elseif mode ~= '' then
    add('#k', 'rw')
  end
  if mode ~= '' then
    add('#m', mode)
  end
  if mark then
    add(mark, mode == 'r' and owner or 1)
  end
  if mode == 'r' then
    local d = now_ms() + tonumber(ttl)
    add('#e:' .. owner, d)
    add('#r', 1)
    add('#x', d)
  end
  redis.call('HSET', unpack(args))
  redis.call('PEXPIRE', k_lock, ttl)
end

-- The op log keeps the hold ids of an owner's RECENT last releases (newest first), so a
-- retried release is recognised even after the same owner (a Client's cohort, a WithOwner
-- id) released other holds meanwhile.
local RECENT = 4

-- log_release records hold id among owner's recent releases in the op log (kept log_ttl ms).
local function log_release(k_log, owner, id, log_ttl)
  local k = 'r:' .. owner
  local v, n = id, 1
  for x in string.gmatch(redis.call('HGET', k_log, k) or '', '%S+') do
    if n == RECENT then break end
    v, n = v .. ' ' .. x, n + 1
  end
  redis.call('HSET', k_log, k, v)
  redis.call('PEXPIRE', k_log, log_ttl)
end
