-- lib.lua follows head.lua in the lock scripts (see scripts.go), inside the function that
-- serves the calls an operation's fast path leaves: the FIFO hand-off, read-write locks,
-- semaphores and the clean-up of calls whose replies were lost. It defines no entry point of
-- its own.

-- layout_error is the reply to a lock hash of another layout.
local function layout_error(k_lock)
  return redis.error_reply('DLOCKLAYOUT lock ' .. k_lock ..
    ' was written by another dlock version (key layout other than ' .. LAYOUT .. ')')
end

-- first_waiter returns the first live waiter of the queue (a sorted set scored by the time,
-- in ms, each waiter joined) and how long it has waited, dropping dead waiters on the way;
-- nil when nobody live waits. The wait is never below 0: a score may run up to 1 ms ahead of
-- the clock (place_after_tail), and a negative wait would read as shorter than a barging
-- window of 0, so a caller that must not barge would go ahead of the waiter, and a release
-- asked to hand the lock on at once would free it instead.
local function first_waiter(k_queue, k_live)
  local now
  while true do
    local e = redis.call('ZRANGE', k_queue, 0, 0, 'WITHSCORES')
    if #e == 0 then return nil end
    now = now or now_ms()
    if tonumber(redis.call('HGET', k_live, e[1]) or '0') >= now then
      return e[1], math.max(0, now - tonumber(e[2]))
    end
    redis.call('ZREM', k_queue, e[1])
    redis.call('HDEL', k_live, e[1])
  end
end

-- place_after_tail returns the queue score of a waiter joining at now (ms): now, or just
-- after the latest waiter's when that is not below now. Scores are the queue's only order, and
-- equal scores sort by member name, so waiters joining in one millisecond would be served by
-- name, not arrival: a reader that came after a waiting writer would go first. Only scores up
-- to now + 1 count (a burst of joins runs ahead of the clock by far less): one written under
-- a clock ahead of this server's (a step back, a failover) would otherwise be passed on to
-- every later waiter, whose wait would count as 0 (first_waiter) until the clock caught up,
-- so it would not be granted a lock directly while callers outside the queue barge ahead of it
-- within the barging window. A score after the latest is a
-- string with 3 decimals: Lua passes a number to Redis with 14 digits, dropping the fraction.
local function place_after_tail(k_queue, now)
  local last = redis.call('ZRANGE', k_queue, now + 1, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  if last and tonumber(last) >= now then
    return string.format('%.3f', tonumber(last) + 0.001)
  end
  return now
end

-- leave_queue takes a waiter out of the queue.
local function leave_queue(k_queue, k_live, who)
  redis.call('ZREM', k_queue, who)
  redis.call('HDEL', k_live, who)
end

-- Read-write locks. Their lock hash also carries "#k" = "rw" and "#m", the mode: "w" (one
-- owner, as a mutex) or "r" (readers). In read mode every reader owner has "#e:"..owner, its
-- deadline in server ms, and its hold marks ("#"..holdId) name it, so a reader whose process
-- died is pruned by the next script that meets the lock while the key's TTL (the latest
-- reader's deadline) keeps the others. A reader admitted by a grant and not yet confirmed has
-- count 0 (a confirmed reader at least 1), so only the grantee's own acquire confirms it.
-- "#t" is the token of the phase: a writer's own, or the
-- one reserved when the read phase began, shared by its readers. Queue members of a read-write
-- lock are "r:"..owner and "w:"..owner; a mutex's are owners. mode is '' for a mutex.

-- member returns owner's queue member in mode; sem, for a semaphore's waiter, is {permits,
-- n}: its member carries the semaphore's number of permits and how many it waits for
-- ("#s:<permits>:<n>:"..owner; no owner id starts with '#'), so every script can grant it as
-- a semaphore would.
local function member(mode, owner, sem)
  if sem then
    return '#s:' .. sem[1] .. ':' .. sem[2] .. ':' .. owner
  end
  if mode == '' then return owner end
  return mode .. ':' .. owner
end

-- split_member returns a queue member's mode, owner and, for a semaphore's waiter (mode
-- "s"), its {permits, n} ("r:"/"w:" members are a read-write lock's, "#s:" a semaphore's;
-- owner ids may not start so, see WithOwner).
local function split_member(m)
  local p = m:sub(1, 2)
  if p == 'r:' or p == 'w:' then
    return m:sub(1, 1), m:sub(3)
  end
  if p == '#s' then
    local permits, n, owner = m:match('^#s:(%d+):(%d+):(.+)$')
    if owner then
      return 's', owner, {tonumber(permits), tonumber(n)}
    end
  end
  return '', m
end

-- member_kind is the kind ("#k" value) of the lock a queue member waits for.
local function member_kind(m)
  local mode, _, sem = split_member(m)
  if sem then return 'sem' end
  if mode ~= '' then return 'rw' end
  return ''
end

-- KINDS names a lock hash's "#k" field for each kind of lock, as an error message says it.
local KINDS = {[''] = 'a mutex', rw = 'a read-write lock', sem = 'a semaphore', latch = 'a latch'}

-- kind_error is the reply to a script of one kind of lock (want: a "#k" value, '' for a
-- mutex) on a lock of another (has).
local function kind_error(k_lock, want, has)
  return redis.error_reply('DLOCKKIND lock ' .. k_lock .. ' is ' .. (KINDS[has or ''] or 'a ' .. has) ..
    ', not ' .. KINDS[want])
end

-- is_mark reports a hold mark field ("#"..holdId; the reserved fields are "#" and one letter,
-- "#e:"..owner or "#c:"..owner).
local function is_mark(f)
  local p = f:sub(2, 3)
  return f:sub(1, 1) == '#' and #f > 2 and p ~= 'e:' and p ~= 'c:'
end

-- In read mode the hash also keeps "#r", how many reader owners it has, and "#x", a lower bound
-- of their deadlines: readers are pruned (one read of the whole hash) only once the clock has
-- passed "#x", about once per lease TTL, not on every call.

-- add_reader adds owner as a reader of a lock in read mode (count 1, or 0 without a mark: a
-- grant to confirm), counts a hold (mark) it does not have yet for an owner that reads
-- already (one WithOwner id in several places), and renews its deadline: the later of the
-- one it has and now + ttl. The key's TTL only grows. permits, for a new holder of a
-- semaphore, is how many permits it takes.
local function add_reader(k_lock, owner, mark, ttl, permits)
  local e = '#e:' .. owner
  local had = redis.call('HGET', k_lock, e)
  if not had then
    redis.call('HINCRBY', k_lock, '#r', 1)
    redis.call('HSET', k_lock, owner, mark and 1 or 0)
    if permits then
      redis.call('HSET', k_lock, '#c:' .. owner, permits)
      redis.call('HINCRBY', k_lock, '#u', permits)
    end
    if mark then
      redis.call('HSET', k_lock, mark, owner)
    end
  elseif mark and redis.call('HEXISTS', k_lock, mark) == 0 then -- not HSETNX: not in the minimal ACL
    redis.call('HSET', k_lock, mark, owner)
    redis.call('HINCRBY', k_lock, owner, 1)
  end
  local d = math.max(tonumber(had or '0'), now_ms() + tonumber(ttl))
  local x = tonumber(redis.call('HGET', k_lock, '#x') or '0')
  if x == 0 or d < x then
    redis.call('HSET', k_lock, e, d, '#x', d)
  else
    redis.call('HSET', k_lock, e, d)
  end
  redis.call('PEXPIRE', k_lock, ttl, 'GT')
end

-- hdel deletes fields of a hash, in chunks (Lua's unpack has a limit).
local function hdel(k, fields)
  for i = 1, #fields, 1000 do
    redis.call('HDEL', k, unpack(fields, i, math.min(i + 999, #fields)))
  end
end

-- prune_readers drops the readers whose deadline has passed (their process died or paused
-- past its lease), with their marks (and, on a semaphore, their permits), and returns how
-- many readers remain. Unless force is set it reads the whole hash only once the clock has
-- passed "#x".
local function prune_readers(k_lock, force)
  local now = now_ms()
  local rx = redis.call('HMGET', k_lock, '#r', '#x')
  if not force and tonumber(rx[2] or '0') >= now then
    return tonumber(rx[1] or '0')
  end
  local all = redis.call('HGETALL', k_lock)
  local dead, live, earliest, permits, sem = {}, 0, nil, {}, false
  for i = 1, #all, 2 do
    local f = all[i]
    local p = f:sub(1, 3)
    if p == '#e:' then
      local d = tonumber(all[i + 1])
      if d < now then
        dead[f:sub(4)] = true
      else
        live, earliest = live + 1, math.min(earliest or d, d)
      end
    elseif p == '#c:' then
      permits[f:sub(4)] = tonumber(all[i + 1])
    elseif f == '#k' then
      sem = all[i + 1] == 'sem'
    end
  end
  if next(dead) then
    local del = {}
    for i = 1, #all, 2 do
      local f, v = all[i], all[i + 1]
      local p = f:sub(1, 3)
      if dead[f] or ((p == '#e:' or p == '#c:') and dead[f:sub(4)]) or (is_mark(f) and dead[v]) then
        del[#del + 1] = f
      end
    end
    hdel(k_lock, del)
  end
  if sem then
    local used = 0
    for o, n in pairs(permits) do
      if not dead[o] then
        used = used + n
      end
    end
    redis.call('HSET', k_lock, '#r', live, '#x', earliest or 0, '#u', used)
  else
    redis.call('HSET', k_lock, '#r', live, '#x', earliest or 0)
  end
  return live
end

-- remove_reader takes a reader out of a lock in read mode: its count, deadline, permits (sem:
-- a semaphore's holder) and (when given) its last mark, and returns how many readers remain.
local function remove_reader(k_lock, owner, mark, sem)
  local c = '#c:' .. owner
  if sem then
    local n = redis.call('HGET', k_lock, c)
    if n then
      redis.call('HINCRBY', k_lock, '#u', -tonumber(n))
    end
  end
  if mark then
    redis.call('HDEL', k_lock, owner, '#e:' .. owner, c, mark)
  else
    redis.call('HDEL', k_lock, owner, '#e:' .. owner, c)
  end
  redis.call('HINCRBY', k_lock, '#r', -1)
  return prune_readers(k_lock)
end

-- drop_reader takes owner's reader entry and every mark of it out of a lock in read mode (a
-- stale entry of ours: the marks are unknown) and returns how many readers remain.
local function drop_reader(k_lock, owner)
  redis.call('HSET', k_lock, '#e:' .. owner, 0)
  return prune_readers(k_lock, true)
end

-- A waiter's queued attempts record, in the op log, the hold it will hold if granted:
-- p:<queue member> = "<holdId> <attempt> <ttl ms>" (one hold id for the whole wait, the
-- number of the attempt that recorded it; by member, since one owner id may wait to read and
-- to write at once). A grant to such a waiter writes that hold in full (count 1 and its mark),
-- so the waiter holds the lock the moment the grant is published ("G <holdId> <attempt>
-- <grant TTL ms> <token> <waiting> <owner>") and starts its lease on the message alone, with
-- no confirming round trip, if that attempt is the last one Redis answered it (so the grant
-- came after it). The grant's TTL is the grace (or the waiter's
-- own TTL if shorter): a killed waiter still stalls the lock no longer than before, and the
-- grantee's first renewal, due within the grace, gives the lock its full TTL. A waiter without
-- a record (a client of an earlier dlock version) is granted as before: "g <owner>", no mark,
-- and its own acquire confirms the grant.

-- pending_hold returns the mark the waiting queue member who recorded, the rest of the grant
-- message for it ("<holdId> <attempt> <grant TTL>") and the grant's TTL (the grace, or the
-- waiter's TTL if shorter), removing the record; nil, nil and the grace without one.
local function pending_hold(k_log, who, grace)
  local k = 'p:' .. who
  local p = redis.call('HGET', k_log, k)
  if not p then
    return nil, nil, grace
  end
  redis.call('HDEL', k_log, k)
  local id, n, ttl = p:match('^(%S+) (%d+) (%d+)')
  if not id then
    return nil, nil, grace
  end
  ttl = math.min(tonumber(grace), tonumber(ttl))
  return '#' .. id, id .. ' ' .. n .. ' ' .. string.format('%d', ttl), ttl
end

-- grant_msg is the message announcing a grant to owner: "G ..." with the hold written for it
-- (rec from pending_hold), "g <owner>" for a grant it confirms itself. waiting is 1 when
-- someone still waits in the queue behind the readers granted (their Client then lets no new
-- local reader share the hold).
local function grant_msg(owner, rec, t, waiting)
  if rec then
    return 'G ' .. rec .. ' ' .. t .. ' ' .. waiting .. ' ' .. owner
  end
  return 'g ' .. owner
end

-- admit grants a lock in read mode to the waiters first in its queue, in order, up to the
-- first that may not come in: for a read-write lock up to the first writer (no reader waits
-- behind readers); for a semaphore (sem set) up to the first whose permits do not fit, or that
-- names another number of permits than the semaphore's (its own next attempt is refused).
-- Each is written with its recorded hold (see above) or, without one, gets the grace TTL to
-- confirm and a grant record with the token t. Their messages go to msgs, after those of
-- granted ({owner, record} pairs: the waiters the caller granted already).
local function admit(k_lock, k_log, k_queue, k_live, t, grace, log_ttl, msgs, granted, sem)
  granted = granted or {}
  local permits, used
  if sem then
    local nu = redis.call('HMGET', k_lock, '#n', '#u')
    permits, used = tonumber(nu[1] or '0'), tonumber(nu[2] or '0')
  end
  local head
  for _ = 1, 1000 do -- bounded: a longer line is admitted by later scripts
    head = first_waiter(k_queue, k_live)
    if not head then
      break
    end
    local mode, owner, theirs = split_member(head)
    local n
    if sem then
      if mode ~= 's' or theirs[1] ~= permits or used + theirs[2] > permits then
        break
      end
      n, used = theirs[2], used + theirs[2]
    elseif mode ~= 'r' then
      break
    end
    leave_queue(k_queue, k_live, head)
    local mark, rec, ttl = pending_hold(k_log, head, grace)
    if not mark then
      redis.call('HSET', k_log, 'g:' .. owner, t)
      redis.call('PEXPIRE', k_log, log_ttl)
    end
    add_reader(k_lock, owner, mark, ttl, n)
    granted[#granted + 1] = {owner, rec}
  end
  local waiting = head and 1 or 0
  for _, g in ipairs(granted) do
    msgs[#msgs + 1] = grant_msg(g[1], g[2], t, waiting)
  end
end

-- Semaphores. A semaphore is a lock in read mode whose "#k" is "sem": its holders are readers,
-- each with the permits it holds in "#c:"..owner; "#n" is its number of permits and "#u" how
-- many are out. Its waiters' queue members say how many permits they wait for (member), and
-- admit lets them in strictly first come first served: one that waits for many is not
-- overtaken by later ones that would fit.

-- grant hands the free lock to the queue member head, as the kind of lock it waits for: with
-- the hold it recorded, or with the short TTL grace until it confirms by running acquire (see
-- above); a reader at the head brings every reader queued right behind it (they share the
-- phase's token), and a semaphore's waiter those behind it whose permits fit. A grant to be
-- confirmed is recorded in the op log (g:<owner> = token) before the lock is written, so the
-- grantee can tell it from a stale one. It returns the token; the messages the caller
-- publishes last (notify_all) are appended to msgs.
local function grant(k_lock, k_fence, k_log, k_queue, k_live, head, grace, log_ttl, msgs)
  local mode, owner, sem = split_member(head)
  if sem then
    mode = 'r'
  end
  local token = reserve_block(k_fence, log_ttl)
  local t = string.format('%d', token)
  local mark, rec, ttl = pending_hold(k_log, head, grace)
  if not mark then
    redis.call('HSET', k_log, 'g:' .. owner, t)
    redis.call('PEXPIRE', k_log, log_ttl)
  end
  hold_lock(k_lock, owner, mark, token, ttl, mode, sem)
  if mode == 'r' then
    admit(k_lock, k_log, k_queue, k_live, t, grace, log_ttl, msgs, {{owner, rec}}, sem)
  else
    msgs[#msgs + 1] = grant_msg(owner, rec, t, 0)
  end
  return token
end

-- released_before reports whether owner released the hold id among its recent releases
-- (r:<owner> in the op log, head.lua log_release): a retried release that was applied, or an
-- acquire that came late after its hold was taken and released already.
local function released_before(k_log, owner, id)
  for x in string.gmatch(redis.call('HGET', k_log, 'r:' .. owner) or '', '%S+') do
    if x == id then
      return true
    end
  end
  return false
end

-- notify publishes msg on channel, last in a script: a user that may not publish loses the
-- wake-up, never a write.
local function notify(publish, channel, msg)
  redis.pcall(publish, channel, msg)
end

-- notify_all publishes every message of msgs, last in a script.
local function notify_all(publish, channel, msgs)
  for _, m in ipairs(msgs) do
    redis.pcall(publish, channel, m)
  end
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

-- latch_fields reads a latch's "#k", "#v" and then the fields asked; it returns them (all nil
-- for an open latch: no key), or nil and the error reply for a key that is no latch of this
-- layout (a lock, a semaphore, another type, another dlock version), which is left as it is.
local function latch_fields(k_latch, ...)
  local f = lock_fields(k_latch, '#k', '#v', ...)
  if not f then
    return nil, kind_error(k_latch, 'latch', 'value of another type')
  end
  if not f[1] and not f[2] then
    if redis.call('EXISTS', k_latch) == 1 then
      return nil, kind_error(k_latch, 'latch', 'value of another type')
    end
    return f
  end
  if f[2] ~= LAYOUT then
    return nil, layout_error(k_latch)
  end
  if f[1] ~= 'latch' then
    return nil, kind_error(k_latch, 'latch', f[1])
  end
  return f
end

-- drop_hold takes the hold mark of owner out of the lock, if there: a hold a waiter took, or
-- was granted, under a hold id it gave up (the attempt got no usable reply) and never used.
-- It returns nil when the lock has no such hold, 1 when the lock is still held (the owner's
-- other holds, other readers), 0 when that was its last hold: the caller frees the lock.
local function drop_hold(k_lock, owner, mark)
  local g = lock_fields(k_lock, mark, owner, '#m', '#k')
  if not g or not g[1] then
    return nil
  end
  if g[2] ~= '1' then
    redis.call('HDEL', k_lock, mark)
    redis.call('HINCRBY', k_lock, owner, -1)
    return 1
  end
  if g[3] == 'r' and remove_reader(k_lock, owner, mark, g[4] == 'sem') > 0 then
    return 1
  end
  return 0
end

-- drop_holds drops (drop_hold) the holds of owner named by ids, a space-separated list of hold
-- ids a wait gave up, and reports whether any was found and whether the lock is now free of
-- holds. With log_ttl (not nil) it marks each id in the op log (u:<id>), for ids whose
-- attempts got no usable reply: one under it that reaches Redis only now, after later ones
-- (a lost command delivered late), then changes nothing. Such marks come only with failures.
local function drop_holds(k_lock, k_log, owner, ids, log_ttl)
  local found, free, any = false, false, false
  for id in string.gmatch(ids or '', '%S+') do
    if log_ttl then
      redis.call('HSET', k_log, 'u:' .. id, 1)
      any = true
    end
    local r = drop_hold(k_lock, owner, '#' .. id)
    if r ~= nil then
      found = true
      free = free or r == 0
    end
  end
  if any then
    redis.call('PEXPIRE', k_log, log_ttl)
  end
  return found, free
end
