-- acquire: take, re-enter, confirm a grant of, or queue for a reentrant, fenced lock.
--
-- KEYS[1] lock hash   {owner: holdCount, "#"..holdId: 1 per hold, "#t": the hold's first
--                     token, "#v": layout}, PEXPIRE'd to the lease TTL; the per-hold fields
--                     make retries, releases and loss checks exact per hold
-- KEYS[2] fence       the highest token reserved, never below the server clock in µs; it
--                     expires once the clock has passed it (see reserve_block)
-- KEYS[3] op log      hash: r:<owner> = hold id of the owner's last release,
--                     g:<owner> = token of a lock granted to the owner while it waited,
--                     p:<queue member> = the hold a grant writes for that waiter (lib.lua),
--                     u:<hold id> = 1 for a hold id given up (drop_holds, and the
--                     clean-up of a call whose reply was lost, release.lua),
--                     w = the queue score (place) of the latest writer that joined
-- KEYS[4] queue       sorted set of waiting owners scored by when they joined (ms, made
--                     distinct: place_after_tail): FIFO
-- KEYS[5] liveness    hash {waiting owner: deadline in ms of server time}
-- ARGV[1] owner id
-- ARGV[2] lease TTL in ms
-- ARGV[3] hold id: unique per call, resent unchanged when the call is retried; a waiter's
--         queued attempts all send the one its wait will hold if granted (see lib.lua)
-- ARGV[4] op log TTL in ms
-- ARGV[5] "1" to join (or stay in) the queue when not obtained
-- ARGV[6] liveness window in ms: a waiter not heard from for this long is skipped
-- ARGV[7] notification channel
-- ARGV[8] grace in ms: TTL of a lock granted to a waiter until it confirms
-- ARGV[9] PUBLISH or SPUBLISH
-- ARGV[10] "1" if the owner re-enters its own holds (counted); "0" for a Client's cohort,
--          whose own hold still found in Redis is stale (it lost track of it) and is re-taken
--          as a fresh hold with a new token block, if an earlier call took it (hold ids grow
--          per Client); a hold a later call took means this command came late: it changes
--          nothing
-- ARGV[11] queue keys' TTL in ms: a queue no waiter refreshes for this long disappears
-- ARGV[12] barging window in ms: a caller outside the queue may take a free lock ahead of a
--          first waiter that has waited less than this (0: never), as a new goroutine may
--          take a sync.Mutex ahead of a waiter that has not starved yet
-- ARGV[13] mode: "" for a mutex; "r" (shared) or "w" (exclusive) for a read-write lock (see
--          lib.lua). A reader joins a lock in read mode unless someone waits in its queue
--          (a waiting writer stops new readers), and readers first in line are admitted
--          together. A read-write lock's owner that holds it to read may not take it to write
--          (DLOCKUPGRADE error: two upgraders would wait for each other forever); one that
--          holds it to write re-enters it to read.
-- ARGV[14] the number of this attempt in its wait (lib.lua: a grant names the attempt that
--          recorded the hold it writes)
-- ARGV[15] hold ids of the wait's earlier attempts that got no usable reply (space-separated):
--          holds under them, taken or granted and never used, are dropped first, and an
--          attempt under one of them that arrives later changes nothing (as does any attempt
--          under a hold id marked given up in the op log)
-- ARGV[16] with mode "s" (a semaphore, lib.lua): the permits this call takes (1..ARGV[17])
-- ARGV[17] with mode "s": the semaphore's number of permits; a semaphore held (or granted to
--          its first waiter) with another number is refused with a DLOCKPERMITS error (a free
--          one with nobody waiting takes this number). A free lock whose first waiter waits for
--          another kind of lock is refused with DLOCKKIND: the name is in use as that kind.
--
-- Returns {1, token, holdCount, waiting} when the caller holds the lock after the call (fresh,
-- re-entered, a granted lock now confirmed, or a retry of a call that already succeeded;
-- waiting, for a reader, is 1 when someone waits in the queue: its Client then lets no more
-- local readers share the hold);
-- {0, pttl, foreign, behind} when it does not (pttl: the lock's remaining TTL in ms, -1
-- without TTL; foreign 1 when the key holds something other than a lock hash; behind 1 when
-- the caller, a queued reader, has a writer queued at or after its place, so its Client's later
-- readers must not join that place). A lock hash of another
-- layout is refused with a DLOCKLAYOUT error, a lock of one kind (mutex, read-write lock,
-- semaphore) taken as another with DLOCKKIND, and left as it is.
-- TTLs of a held lock only grow here (PEXPIRE GT): other holds of the owner may rely on them.
local owner, mark = ARGV[1], '#' .. ARGV[3]
local mode = ARGV[13] or ''
-- A semaphore's holders are readers, each with its permits (lib.lua).
local sem
if mode == 's' then
  mode = 'r'
  sem = {tonumber(ARGV[17]), tonumber(ARGV[16])}
  if not sem[1] or not sem[2] or sem[2] < 1 or sem[2] > sem[1] then
    return redis.error_reply('DLOCKPERMITS lock ' .. KEYS[1] .. ': cannot take ' .. tostring(ARGV[16]) ..
      ' of ' .. tostring(ARGV[17]) .. ' permits')
  end
end
local kind = sem and 'sem' or (mode ~= '' and 'rw' or '')

-- permits_error is the reply to a semaphore's call naming another number of permits than the
-- semaphore held (or waited for) with theirs.
local function permits_error(theirs)
  return redis.error_reply('DLOCKPERMITS lock ' .. KEYS[1] .. ' is a semaphore of ' .. tostring(theirs) ..
    ' permits, not ' .. sem[1])
end
local me = member(mode, owner, sem)
local record = 'p:' .. me -- our place's record in the op log, while we wait (lib.lua)
local msgs = {}

local function done(res)
  notify_all(ARGV[9], ARGV[7], msgs)
  return res
end

-- holds is the reply of a call after which the caller holds the lock.
local function holds(token, count)
  local waiting = 0
  if mode == 'r' and not sem then
    waiting = redis.call('EXISTS', KEYS[4])
  end
  return done({1, token, count, waiting})
end

-- let_in lets the waiters queued first (readers, or a semaphore's whose permits fit) join a
-- lock this caller has just taken or joined in read mode.
local function let_in(token)
  if mode == 'r' then
    admit(KEYS[1], KEYS[3], KEYS[4], KEYS[5], string.format('%d', token), ARGV[8], ARGV[4], msgs, nil, sem)
  end
end

local function fresh()
  local token = reserve_block(KEYS[2], ARGV[4])
  hold_lock(KEYS[1], owner, mark, token, ARGV[2], mode, sem)
  let_in(token)
  return holds(token, 1)
end

-- join adds the caller as a reader of the lock in read mode (phase token t).
local function join(t)
  add_reader(KEYS[1], owner, mark, ARGV[2], sem and sem[2])
  let_in(t)
  return holds(t, 1)
end

-- fits reports whether the caller's permits fit in a semaphore held now (always true for a
-- lock).
local function fits()
  if not sem then
    return true
  end
  return tonumber(redis.call('HGET', KEYS[1], '#u') or '0') + sem[2] <= sem[1]
end

-- hold_seq returns the number of a hold id as the Client makes them (nextHoldID: the Client's
-- nonce in 16 hex digits, then a number that grows with every id, in base 36) and the nonce;
-- nil for an id of another form.
local function hold_seq(id)
  if #id <= 16 then
    return nil
  end
  local n = tonumber(id:sub(17), 36)
  if not n then
    return nil
  end
  return n, id:sub(1, 16)
end

-- later_own_hold reports whether the lock has a hold of owner (reading: its reader marks)
-- whose id its Client made after id. An owner that never re-enters (a Client's cohort, a
-- MultiLock call, a shared read hold) is one Client's, so its ids are comparable: a hold of it
-- without this call's mark is stale only if an earlier call took it. Read only on that path.
local function later_own_hold(k_lock, who, id, reading)
  local n, nonce = hold_seq(id)
  if not n then
    return false
  end
  local all = redis.call('HGETALL', k_lock)
  for i = 1, #all, 2 do
    if is_mark(all[i]) and (not reading or all[i + 1] == who) then
      local m, other = hold_seq(all[i]:sub(2))
      if m and other == nonce and m > n then
        return true
      end
    end
  end
  return false
end

-- record_value is our place's record (lib.lua): this attempt's hold id, its number, our TTL.
local function record_value()
  return ARGV[3] .. ' ' .. (ARGV[14] or '0') .. ' ' .. ARGV[2]
end

local function queue_up(foreign)
  local behind = 0
  if ARGV[5] == '1' then
    local now = now_ms()
    local joined = now
    if redis.call('HSET', KEYS[5], me, now + tonumber(ARGV[6])) == 1 then
      joined = place_after_tail(KEYS[4], now)
      redis.call('ZADD', KEYS[4], 'NX', joined, me) -- a new waiter (a refresh only moves its deadline)
      if mode == 'w' then
        -- A writer waits: Clients sharing a read hold, or waiting for one on behalf of their
        -- readers, let no new local reader in ahead of it. Told by push, and by the place
        -- of the latest writer, which a reader's wait reads below (no push needed).
        msgs[#msgs + 1] = 'x'
        redis.call('HSET', KEYS[3], 'w', joined)
      end
    elseif mode == 'r' and not sem then
      -- Our place's score: ZSCORE, by a command the documented ACL allows (adds 0, changes
      -- nothing, so nothing is replicated or invalidated).
      joined = tonumber(redis.call('ZADD', KEYS[4], 'XX', 'INCR', 0, me) or now)
    end
    if mode == 'r' and not sem then
      -- A writer joined after our place (places are distinct): our Client's later readers
      -- must wait behind it, not join our place.
      local w = redis.call('HGET', KEYS[3], 'w')
      if w and tonumber(w) > tonumber(joined) then
        behind = 1
      end
    end
    -- The hold a grant will write for us (lib.lua): this wait's hold id and our TTL.
    redis.call('HSET', KEYS[3], record, record_value())
    redis.call('PEXPIRE', KEYS[3], ARGV[4])
    -- The queue lives while anyone waits in it, and disappears on its own after.
    redis.call('PEXPIRE', KEYS[4], ARGV[11])
    redis.call('PEXPIRE', KEYS[5], ARGV[11])
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if sem and pttl > 0 and foreign == 0 then
    -- Permits of a dead holder free at its deadline, the earliest of which "#x" bounds: try
    -- again then, not at the key's TTL (the latest holder's). Not on a key of another type,
    -- which HGET would refuse after the queue writes above.
    local x = tonumber(redis.call('HGET', KEYS[1], '#x') or '0')
    if x > 0 then
      pttl = math.max(1, math.min(pttl, x - now_ms() + 1))
    end
  end
  return done({0, pttl, foreign, behind})
end

-- ahead reports whether the caller may go ahead of the queue's first live waiter head (which
-- has waited waited ms): it is head itself (and leaves the queue), or head has waited less
-- than the barging window and the caller is not queued.
local function ahead(head, waited)
  if head == me then
    leave_queue(KEYS[4], KEYS[5], me)
    redis.call('HDEL', KEYS[3], record)
    return true
  end
  if mode == 'r' and head:sub(1, 2) == 'w:' then
    return false -- a reader never barges ahead of a waiting writer
  end
  return waited < tonumber(ARGV[12]) and redis.call('HEXISTS', KEYS[5], me) == 0
end

-- take_free takes the free lock, or grants it to the first waiter when the caller may not go
-- ahead of it, and then queues the caller (or, a reader granted along with readers first in
-- line while no writer waits, joins them).
local function take_free()
  local head, waited = first_waiter(KEYS[4], KEYS[5])
  if head and member_kind(head) ~= kind then
    -- Its waiters wait for another kind of lock: the name is in use as that kind.
    return kind_error(KEYS[1], kind, member_kind(head))
  end
  if sem and head then
    local _, _, theirs = split_member(head)
    if theirs[1] ~= sem[1] then
      return permits_error(theirs[1])
    end
  end
  if head == nil or ahead(head, waited) then
    return fresh()
  end
  -- It goes to the waiter ahead of us.
  leave_queue(KEYS[4], KEYS[5], head)
  local token = grant(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], head, ARGV[8], ARGV[4], msgs)
  if (mode == 'r' and head:sub(1, 2) == 'r:') or (sem and member_kind(head) == 'sem') then
    local c = redis.call('HMGET', KEYS[1], owner, mark)
    if c[1] == '0' then
      -- We were queued among the readers admitted: confirm our own grant now (add_reader
      -- counts our hold; our own deadline replaces the grace).
      redis.call('HDEL', KEYS[3], 'g:' .. owner)
      redis.call('HSET', KEYS[1], '#e:' .. owner, 0)
      return join(token)
    end
    if c[2] or (c[1] and ARGV[10] == '1') then
      -- Admitted with the hold we recorded (it gets our TTL), or our owner id was, for another
      -- of its waits: this call is one more hold of it, as a re-entry.
      return join(token)
    end
    if first_waiter(KEYS[4], KEYS[5]) == nil and fits() then
      return join(token)
    end
  end
  return queue_up(0)
end

-- later_record reports whether our place's record names a hold id our Client made after this
-- call's: a later attempt of a wait of ours recorded it.
local function later_record()
  local rec = redis.call('HGET', KEYS[3], record)
  local n, nonce = hold_seq(rec and rec:match('^(%S+)') or '')
  local m, ours = hold_seq(ARGV[3])
  return n ~= nil and m ~= nil and nonce == ours and n > m
end

-- A command that came late must change nothing: one under a hold id given up (a wait's, lib.lua
-- drop_holds, or a call's whose reply was lost and whose clean-up ran first, release.lua), one
-- whose hold was taken and released already (the first send of a call go-redis resent, the
-- resend answered), or a queued attempt older than the one that recorded our place.
if redis.call('HEXISTS', KEYS[3], 'u:' .. ARGV[3]) == 1 or released_before(KEYS[3], owner, ARGV[3])
    or (ARGV[5] == '1' and later_record()) then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end

local _, freed = drop_holds(KEYS[1], KEYS[3], owner, ARGV[15], ARGV[4])
if freed then
  redis.call('DEL', KEYS[1]) -- it goes to the first waiter, or to us, below
end

-- A waiter's record names the hold a grant writes for it: from now on this attempt's, not
-- that of an earlier attempt it gave up (a grant below, admitting us along with other
-- readers, would otherwise write a hold nobody uses, which our renewals would keep alive).
if ARGV[5] == '1' and redis.call('HEXISTS', KEYS[3], record) == 1 then
  redis.call('HSET', KEYS[3], record, record_value())
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  return take_free()
end

local fields = {owner, mark, '#t', '#v', '#k', '#m', '#n'}
local f, ok = lock_fields(KEYS[1], unpack(fields))
if not ok then
  return queue_up(1)
end
if f[4] ~= LAYOUT then
  return layout_error(KEYS[1])
end
if (f[5] or '') ~= kind then
  return kind_error(KEYS[1], kind, f[5])
end
if sem and tonumber(f[7]) ~= sem[1] then
  return permits_error(f[7])
end
if f[6] == 'r' then
  -- Readers whose deadline passed are gone; with none left the lock is free.
  if prune_readers(KEYS[1]) == 0 then
    redis.call('DEL', KEYS[1])
    return take_free()
  end
  f = redis.call('HMGET', KEYS[1], unpack(fields))
end
if f[1] and f[6] == 'r' and mode == 'w' then
  -- Before any write: this reply must leave the lock as it was.
  return redis.error_reply('DLOCKUPGRADE lock ' .. KEYS[1] .. ': its owner holds it to read and may not take it to write')
end
if f[6] == 'r' and f[1] == '0' then
  -- A reader admitted by a grant, not yet confirmed: this is the grantee confirming, if the
  -- grant carries the phase's token; otherwise a stale entry of ours, dropped.
  local granted = redis.call('HGET', KEYS[3], 'g:' .. owner)
  redis.call('HDEL', KEYS[3], 'g:' .. owner)
  if granted == f[3] then
    redis.call('HSET', KEYS[1], '#e:' .. owner, 0) -- our own deadline replaces the grace
    add_reader(KEYS[1], owner, mark, ARGV[2]) -- counts our hold: 1
    return holds(tonumber(f[3]), 1)
  end
  if drop_reader(KEYS[1], owner) == 0 then
    redis.call('DEL', KEYS[1])
    return take_free()
  end
  f[1] = nil
end
if f[1] then
  local token, count = tonumber(f[3]), tonumber(f[1])
  -- A retry of a call that already succeeded (its reply was lost) must not count twice; or a
  -- waiter's attempt finding the hold a grant wrote for it (the grant's TTL is the grace,
  -- which this call's lease must not count on). Either way the hold gets our TTL from now.
  if f[2] then
    if f[6] == 'r' then
      add_reader(KEYS[1], owner, nil, ARGV[2])
    else
      redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
    end
    return holds(token, count)
  end
  -- A release handed us the lock while we waited: take it with our own TTL. The grant is
  -- ours only if it carries the hold's token (a stale one, from a grant that ran out, does not).
  local granted = redis.call('HGET', KEYS[3], 'g:' .. owner)
  if granted then
    redis.call('HDEL', KEYS[3], 'g:' .. owner)
    if granted == f[3] and f[6] ~= 'r' then
      redis.call('HSET', KEYS[1], mark, 1)
      -- Our own TTL, not GT: the grace TTL was a placeholder, and with a TTL shorter than
      -- the grace the lock would outlive our lease and stall the next waiter.
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      return holds(token, 1)
    end
  end
  if ARGV[10] ~= '1' then
    if later_own_hold(KEYS[1], owner, ARGV[3], f[6] == 'r') then
      -- A later call of ours took it: this command is the one that came late (its reply
      -- was lost, or go-redis resent it and the resend was answered), and changes nothing.
      return done({0, redis.call('PTTL', KEYS[1]), 0})
    end
    -- Our own stale hold, taken by an earlier call (its lease already ended where we run):
    -- the lock is free of it, and the processes queued for it come first.
    if f[6] ~= 'r' or drop_reader(KEYS[1], owner) == 0 then
      redis.call('DEL', KEYS[1])
      return take_free()
    end
    f[1] = nil -- the other readers still hold it: as a caller that holds nothing
  else
    if f[6] == 'r' then
      add_reader(KEYS[1], owner, mark, ARGV[2]) -- counts the new hold
      count = tonumber(redis.call('HGET', KEYS[1], owner))
    else
      count = redis.call('HINCRBY', KEYS[1], owner, 1)
      redis.call('HSET', KEYS[1], mark, 1)
      redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
    end
    return holds(token, count)
  end
end
if sem then
  -- Waiters first in line whose permits fit go first: maybe us, with the hold we recorded.
  let_in(tonumber(f[3]))
  if redis.call('HEXISTS', KEYS[1], mark) == 1 then
    return join(tonumber(f[3]))
  end
  if first_waiter(KEYS[4], KEYS[5]) == nil and fits() then
    return join(tonumber(f[3]))
  end
  return queue_up(0)
end
if f[6] == 'r' and mode == 'r' then
  -- No barging into a read phase: a reader overtaking a waiting writer could starve it.
  local head = first_waiter(KEYS[4], KEYS[5])
  if head == me then
    leave_queue(KEYS[4], KEYS[5], me)
    redis.call('HDEL', KEYS[3], record)
  end
  if head == nil or head == me then
    return join(tonumber(f[3]))
  end
end
return queue_up(0)
